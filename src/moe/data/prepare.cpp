#include "moe/data/prepare.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "moe/core/error.h"
#include "moe/core/printable.h"
#include "moe/data/npy.h"
#include "moe/data/prepare_outputs.h"
#include "moe/data/token_folder.h"

namespace moe {

namespace fs = std::filesystem;

std::vector<uint16_t> byte_tokenize(const std::string& bytes, int64_t* documents) {
  std::vector<uint16_t> tokens;
  tokens.reserve(bytes.size() + 1);
  int64_t docs = 0;
  size_t doc_start = tokens.size();
  auto end_document = [&] {
    if (tokens.size() > doc_start) {
      tokens.push_back(static_cast<uint16_t>(kByteEosTokenId));
      ++docs;
    }
    doc_start = tokens.size();
  };
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t nl = bytes.find('\n', pos);
    const size_t line_end = nl == std::string::npos ? bytes.size() : nl + 1;
    std::string_view content(bytes.data() + pos, (nl == std::string::npos ? bytes.size() : nl) - pos);
    if (!content.empty() && content.back() == '\r') content.remove_suffix(1);
    if (content == "\f") {
      end_document();
    } else {
      for (size_t i = pos; i < line_end; ++i) tokens.push_back(static_cast<unsigned char>(bytes[i]));
    }
    pos = line_end;
  }
  end_document();
  if (documents) *documents = docs;
  return tokens;
}

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "prepare: cannot read input ", path, ": ", std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  MOE_CHECK(!in.bad(), "prepare: error reading input ", path);
  return bytes;
}

// dataset.json of a byte-level dataset with no files yet.
nlohmann::ordered_json byte_dataset_json() {
  return {{"tokenizer", "byte"},
          {"vocab_size", kByteVocabSize},
          {"eos_token_id", kByteEosTokenId},
          {"dtype", "uint16"},
          {"files", nlohmann::ordered_json::array()}};
}

// The names in a folder, sorted.
std::vector<std::string> folder_entries(const fs::path& dir) {
  std::error_code ec;
  std::vector<std::string> names;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  MOE_CHECK(!ec, "prepare: cannot list output folder ", dir.string(), ": ", ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

// The dataset an --append adds to: the folder's dataset.json, checked to be byte-level and to
// match the folder, or a fresh one when the folder holds no token data at all.
nlohmann::ordered_json appendable_dataset_json(const fs::path& out, const std::vector<std::string>& entries) {
  const fs::path meta_path = out / "dataset.json";
  std::error_code ec;
  if (!fs::exists(meta_path, ec)) {
    std::vector<std::string> npy;
    for (const std::string& name : entries)
      if (fs::path(name).extension() == ".npy") npy.push_back(name);
    MOE_CHECK(npy.empty(), "prepare --append: ", out.string(), " holds .npy files (", file_name_list(npy),
              ") but no dataset.json, so it was not written by prepare and what they hold is unknown; "
              "prepare into a new or empty folder");
    return byte_dataset_json();
  }
  nlohmann::ordered_json meta = read_dataset_json(meta_path.string());
  const nlohmann::ordered_json expected = byte_dataset_json();
  for (const auto& [key, value] : expected.items()) {
    if (key == "files") continue;
    MOE_CHECK(meta.contains(key) && meta[key] == value, "prepare --append: ", meta_path.string(), " has \"", key,
              "\": ", meta.contains(key) ? meta[key].dump() : "(missing)", ", but prepare writes ", value.dump(),
              " (byte-level tokens), so the new files would not belong to that dataset; prepare into a new folder");
  }
  list_token_files(out.string(), "prepare --out");  // the folder must hold what its dataset.json lists before more is added
  return meta;
}

// An exclusive flock on a folder (waits for the holder); released when destroyed.
class FolderLock {
 public:
  explicit FolderLock(const std::string& target) {
    std::error_code ec;
    fs::path p = fs::absolute(target, ec).lexically_normal();
    while (!p.empty() && !fs::is_directory(p, ec) && p != p.parent_path()) p = p.parent_path();
    fd_ = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    MOE_CHECK(fd_ >= 0, "prepare: cannot open ", p.string(), " to lock it: ", std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0) MOE_CHECK(errno == EINTR, "prepare: cannot lock ", p.string(), ": ",
                                                 std::strerror(errno));
  }
  ~FolderLock() { ::close(fd_); }
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

PrepareResult prepare_byte_level(const std::vector<std::string>& inputs, const std::string& out_dir, bool append) {
  MOE_CHECK(!inputs.empty(), "prepare: no input files given");
  MOE_CHECK(!out_dir.empty(), "prepare: no output folder given");
  // Check every input before creating anything.
  std::set<std::string> stems;
  for (const std::string& input : inputs) {
    std::error_code ec;
    // dataset.json records each input's path, and JSON text is UTF-8.
    MOE_CHECK(is_valid_utf8(input), "prepare: the input file name ", printable(input), " is not valid UTF-8 (the ",
              "bytes shown as \\xNN); dataset.json records each input's path as JSON text, which must be UTF-8: ",
              "rename the file (or link to it under a UTF-8 name); nothing was written");
    MOE_CHECK(fs::exists(input, ec), "prepare: input file ", input, " does not exist");
    MOE_CHECK(fs::is_regular_file(input, ec), "prepare: input ", input, " is not a regular file");
    const std::string stem = fs::path(input).stem().string();
    MOE_CHECK(stems.insert(stem).second, "prepare: two inputs share the stem '", stem, "' (", input,
              "); each input becomes <stem>.npy, so stems must be unique");
  }

  // One prepare at a time per output: two --append runs into one folder would each rewrite
  // dataset.json from what they read, and one's files would end up unlisted. The lock is the
  // flock of the output folder's nearest existing ancestor (the folder itself when it exists).
  const FolderLock lock(out_dir);
  const fs::path out(out_dir);
  // The folders this call creates (none when the output exists), outermost first.
  std::vector<std::string> missing;
  {
    std::error_code ec;
    if (!fs::exists(out, ec))
      for (fs::path p = fs::absolute(out, ec).lexically_normal(); !p.empty() && !fs::exists(p, ec);
           p = p.parent_path()) {
        missing.insert(missing.begin(), p.string());
        if (p == p.parent_path()) break;
      }
  }
  // Every temporary name, in the order they are written: the inputs' files, then dataset.json.
  const std::string tmp_suffix = ".tmp-" + std::to_string(::getpid());
  std::vector<std::string> temps;
  const auto temp_of = [&](const std::string& name) {
    std::string hidden = ".";  // appended, not "." + name: GCC 12 warns falsely about that form (-Wrestrict)
    hidden.append(name).append(tmp_suffix);
    return (out / hidden).string();
  };
  for (const std::string& input : inputs) temps.push_back(temp_of(fs::path(input).stem().string() + ".npy"));
  temps.push_back(temp_of("dataset.json"));
  PrepareOutputs outputs(temps, missing, out_dir);

  nlohmann::ordered_json meta = byte_dataset_json();
  bool had_dataset_json = false;
  {
    std::error_code ec;
    if (fs::exists(out, ec)) {
      MOE_CHECK(fs::is_directory(out, ec), "prepare: output path ", out_dir, " exists and is not a folder");
      const std::vector<std::string> entries = folder_entries(out);
      if (!entries.empty()) {
        const bool others = std::any_of(entries.begin(), entries.end(),
                                        [](const std::string& n) { return leftover_temp_pid(n) == 0; });
        refuse_leftover_temps(out, entries, others, append);
        MOE_CHECK(append, "prepare: output folder ", out_dir, " is not empty (it holds ", file_name_list(entries),
                  "); prepare never overwrites: pass --append to add these inputs to the dataset there, or choose "
                  "a new or empty folder");
        meta = appendable_dataset_json(out, entries);
        had_dataset_json = fs::exists(out / "dataset.json", ec);
        std::set<std::string> listed;
        for (const auto& f : meta["files"]) listed.insert(f["name"].get<std::string>());
        for (const std::string& input : inputs) {
          const fs::path target = out / (fs::path(input).stem().string() + ".npy");
          MOE_CHECK(!listed.count(target.filename().string()), "prepare --append: input ", input,
                    " would become ", target.string(), ", which ", (out / "dataset.json").string(),
                    " already lists; nothing was written. Rename the input (its stem names the token file) or "
                    "prepare it into another folder");
          MOE_CHECK(!fs::exists(fs::symlink_status(target, ec)), "prepare --append: input ", input,
                    " would become ", target.string(), ", which already exists; nothing was written. Rename the "
                    "input (its stem names the token file) or prepare it into another folder");
        }
      }
    } else {
      for (size_t i = 0; i < outputs.dirs(); ++i) outputs.create_next_dir();
    }
  }

  PrepareResult result;
  result.out_dir = out_dir;
  std::vector<std::pair<fs::path, fs::path>> renames;  // temp -> final
  for (const std::string& input : inputs) {
    PreparedFile pf;
    pf.name = fs::path(input).stem().string() + ".npy";
    pf.source = input;
    const std::vector<uint16_t> tokens = byte_tokenize(read_file(input), &pf.documents);
    pf.tokens = static_cast<int64_t>(tokens.size());
    MOE_CHECK(pf.tokens > 0, "prepare: input ", input, " holds no text (no document to tokenize); nothing was written");
    const fs::path temp = outputs.claim_temp();
    write_new_npy(temp.string(), tokens);
    // Test hook: wait here, a temporary file written, for a signal (tests/cli/prepare_cli_test.cpp);
    // at most a minute, so a test that fails to send one leaves no process behind for long.
    if (std::getenv("MOE_TEST_PREPARE_PAUSE")) ::sleep(60);
    renames.emplace_back(temp, out / pf.name);
    meta["files"].push_back({{"name", pf.name}, {"tokens", pf.tokens}, {"documents", pf.documents}, {"source", input}});
    result.total_tokens += pf.tokens;
    result.files.push_back(std::move(pf));
  }
  result.listed_files = static_cast<int64_t>(meta["files"].size());

  const fs::path meta_temp = outputs.claim_temp();
  {
    std::ofstream os(meta_temp);
    MOE_CHECK(os.good(), "prepare: cannot write ", meta_temp.string(), ": ", std::strerror(errno));
    os << meta.dump(2) << "\n";
    os.close();
    MOE_CHECK(!os.fail(), "prepare: writing ", meta_temp.string(), " failed");
  }

  // dataset.json last: its presence (or its new list) marks the new files as part of the dataset.
  renames.emplace_back(meta_temp, out / "dataset.json");
  // Every target must still be free (dataset.json may be replaced only when it was read above)
  // before any is renamed: this catches anything created in the folder since it was checked, so
  // nothing is overwritten and no half dataset is left.
  for (const auto& [temp, final_path] : renames) {
    std::error_code ec;
    const bool replaceable = final_path == out / "dataset.json" && had_dataset_json;
    MOE_CHECK(replaceable || !fs::exists(fs::symlink_status(final_path, ec)), "prepare: ", final_path.string(),
              " appeared while prepare ran; nothing was written, run again");
  }
  outputs.commit([&] {
    for (const auto& [temp, final_path] : renames) {
      std::error_code ec;
      fs::rename(temp, final_path, ec);
      MOE_CHECK(!ec, "prepare: cannot rename ", temp.string(), " to ", final_path.string(), ": ", ec.message());
    }
  });
  return result;
}

}  // namespace moe

#include "moe/data/prepare.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "moe/core/error.h"
#include "moe/core/printable.h"
#include "moe/core/rename_no_replace.h"
#include "moe/data/npy.h"
#include "moe/data/prepare_lock.h"
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

// Writes `text` to the new file `path` (a claimed temporary name) and fsyncs it before it is renamed
// into place. The error names the file and the reason (a full disk); the caller removes the file.
void write_dataset_json(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  MOE_CHECK(fd >= 0, "prepare: cannot create ", path, ": ", std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const bool ok = done == text.size() && ::fsync(fd) == 0;
  const int why = errno;
  ::close(fd);
  MOE_CHECK(ok, "prepare: cannot write ", path, ": ", std::strerror(why));
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

// The dataset an --append adds to (the folder holds something): its dataset.json, checked to be
// byte-level and to match the folder. A folder without one was not written by prepare or
// tokenize_hf.py (they write dataset.json into a folder that was new or empty): it is refused,
// whatever it holds, rather than filled with token files among the user's own.
nlohmann::ordered_json appendable_dataset_json(const fs::path& out, const std::vector<std::string>& entries) {
  const fs::path meta_path = out / "dataset.json";
  std::error_code ec;
  if (!fs::exists(meta_path, ec)) {
    std::vector<std::string> npy;
    for (const std::string& name : entries)
      if (fs::path(name).extension() == ".npy") npy.push_back(name);
    MOE_FAIL("prepare --append: ", printable(out.string()), " holds ", file_name_list(npy.empty() ? entries : npy),
             " but no dataset.json, so it is not a dataset prepare or tokenize_hf.py wrote",
             npy.empty() ? "" : " and what its .npy files hold is unknown",
             "; --append adds to such a dataset only: prepare into a new or empty folder");
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

// Test hook (tests/cli/prepare_cli_test.cpp): with MOE_TEST_PREPARE_PAUSE set, waits after each
// temporary token file is written: until that variable names an existing file, or, given "1",
// for a signal. At most a minute, so a test that fails to resume it leaves no process behind for long.
void pause_for_test() {
  const char* pause = std::getenv("MOE_TEST_PREPARE_PAUSE");
  if (pause == nullptr) return;
  if (std::string(pause) == "1") {
    ::sleep(60);
    return;
  }
  std::error_code ec;
  for (int i = 0; i < 6000 && !fs::exists(pause, ec); ++i) ::usleep(10000);
}

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

  const fs::path out(out_dir);
  std::error_code abs_ec;
  fs::path out_abs = fs::absolute(out, abs_ec).lexically_normal();
  if (!out_abs.has_filename()) out_abs = out_abs.parent_path();  // "data/new/" names data/new
  // One prepare at a time per output folder (data/prepare_lock.h).
  OutputFolderLock lock(out_abs);
  // The folders this call creates (none when the output exists), outermost first.
  std::vector<std::string> missing;
  {
    std::error_code ec;
    if (!fs::exists(out, ec))
      for (fs::path p = out_abs; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
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
  temps.push_back(temp_of("write-check"));  // created and removed before any input is read (below)
  for (const std::string& input : inputs) temps.push_back(temp_of(fs::path(input).stem().string() + ".npy"));
  temps.push_back(temp_of("dataset.json"));
  PrepareOutputs outputs(temps, missing, out_dir);

  nlohmann::ordered_json meta = byte_dataset_json();
  bool had_dataset_json = false;
  if (outputs.dirs() > 0) {
    for (size_t i = 0; i < outputs.dirs(); ++i) outputs.create_next_dir();
    // Another prepare may have locked the new folder before this one could, and written there:
    // the checks below see what it wrote.
    lock.move_to_created();
  }
  {
    std::error_code ec;
    if (fs::exists(out, ec)) {
      MOE_CHECK(fs::is_directory(out, ec), "prepare: output path ", out_dir, " exists and is not a folder");
      const std::vector<std::string> entries = folder_entries(out);
      if (!entries.empty()) {
        const bool has_dataset = fs::exists(out / "dataset.json", ec);
        refuse_leftover_temps(out, entries, has_dataset, append);
        MOE_CHECK(append, "prepare: output folder ", out_dir, " is not empty (it holds ", file_name_list(entries),
                  "); prepare never overwrites: ",
                  has_dataset ? "pass --append to add these inputs to the dataset there, or choose a new or empty "
                                "folder"
                              : "it holds no dataset.json, so --append cannot add to it either; choose a new or "
                                "empty folder");
        meta = appendable_dataset_json(out, entries);  // refuses a folder without dataset.json
        had_dataset_json = true;
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
    }
  }

  // Before any input is read: a folder this process cannot create files in would fail at the first
  // token file, after that file's whole input was read and tokenized. The check's own temporary
  // name is created and removed again (an interruption meanwhile removes it as it does the others).
  {
    const std::string& check = outputs.claim_temp();
    std::FILE* f = std::fopen(check.c_str(), "wbx");
    MOE_CHECK(f != nullptr, "prepare: cannot create files in the output folder ", out_dir, " (tried ",
              printable(check), "): ", std::strerror(errno), "; nothing was written");
    std::fclose(f);
    std::error_code ec;
    fs::remove(check, ec);
  }

  PrepareResult result;
  result.out_dir = out_dir;
  while (result.out_dir.size() > 1 && result.out_dir.back() == '/') result.out_dir.pop_back();
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
    pause_for_test();
    renames.emplace_back(temp, out / pf.name);
    meta["files"].push_back({{"name", pf.name}, {"tokens", pf.tokens}, {"documents", pf.documents}, {"source", input}});
    result.total_tokens += pf.tokens;
    result.files.push_back(std::move(pf));
  }
  result.listed_files = static_cast<int64_t>(meta["files"].size());

  const fs::path meta_temp = outputs.claim_temp();
  write_dataset_json(meta_temp.string(), meta.dump(2) + "\n");

  // dataset.json last: its presence (or its new list) marks the new files as part of the dataset.
  renames.emplace_back(meta_temp, out / "dataset.json");
  outputs.commit([&] {
    // Each target must still be free (dataset.json may be replaced only when it was read above):
    // anything created in the folder since it was checked stops the renames, and the files this
    // call already renamed are removed again (they are its own), so nothing is overwritten and no
    // part of a dataset is left.
    size_t renamed = 0;
    try {
      for (const auto& [temp, final_path] : renames) {
        const bool replace = final_path == out / "dataset.json" && had_dataset_json;
        std::error_code ec;
        if (replace) {
          fs::rename(temp, final_path, ec);
        } else if (!rename_no_replace(temp.string(), final_path.string())) {
          MOE_CHECK(errno != EEXIST, "prepare: ", final_path.string(),
                    " appeared while prepare ran; nothing was written, run again");
          ec.assign(errno, std::generic_category());
        }
        MOE_CHECK(!ec, "prepare: cannot rename ", temp.string(), " to ", final_path.string(), ": ", ec.message());
        ++renamed;
      }
    } catch (...) {
      std::error_code ec;
      for (size_t i = renamed; i-- > 0;) fs::remove(renames[i].second, ec);
      throw;
    }
  });
  return result;
}

}  // namespace moe

#include "moe/data/prepare.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "moe/core/error.h"
#include "moe/data/npy.h"

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

// Removes what a failed prepare left: its temporary files and the folders it created (if empty).
struct Cleanup {
  std::vector<fs::path> temps;
  std::vector<fs::path> created_dirs;  // outermost first
  bool armed = true;
  ~Cleanup() {
    if (!armed) return;
    std::error_code ec;
    for (const fs::path& p : temps) fs::remove(p, ec);
    for (auto it = created_dirs.rbegin(); it != created_dirs.rend(); ++it) fs::remove(*it, ec);
  }
};

}  // namespace

PrepareResult prepare_byte_level(const std::vector<std::string>& inputs, const std::string& out_dir) {
  MOE_CHECK(!inputs.empty(), "prepare: no input files given");
  MOE_CHECK(!out_dir.empty(), "prepare: no output folder given");
  // Check every input before creating anything.
  std::set<std::string> stems;
  for (const std::string& input : inputs) {
    std::error_code ec;
    MOE_CHECK(fs::exists(input, ec), "prepare: input file ", input, " does not exist");
    MOE_CHECK(fs::is_regular_file(input, ec), "prepare: input ", input, " is not a regular file");
    const std::string stem = fs::path(input).stem().string();
    MOE_CHECK(stems.insert(stem).second, "prepare: two inputs share the stem '", stem, "' (", input,
              "); each input becomes <stem>.npy, so stems must be unique");
  }

  Cleanup cleanup;
  const fs::path out(out_dir);
  {
    std::error_code ec;
    if (fs::exists(out, ec)) {
      MOE_CHECK(fs::is_directory(out, ec), "prepare: output path ", out_dir, " exists and is not a folder");
    } else {
      // Remember which folders this call creates, so a failure can remove them again.
      std::vector<fs::path> missing;
      for (fs::path p = fs::absolute(out, ec).lexically_normal(); !p.empty() && !fs::exists(p, ec);
           p = p.parent_path()) {
        missing.insert(missing.begin(), p);
        if (p == p.parent_path()) break;
      }
      for (const fs::path& p : missing) {
        MOE_CHECK(fs::create_directory(p, ec) && !ec, "prepare: cannot create output folder ", p.string(), ": ",
                  ec.message());
        cleanup.created_dirs.push_back(p);
      }
    }
  }

  const std::string tmp_suffix = ".tmp-" + std::to_string(::getpid());
  PrepareResult result;
  result.out_dir = out_dir;
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  std::vector<std::pair<fs::path, fs::path>> renames;  // temp -> final
  for (const std::string& input : inputs) {
    PreparedFile pf;
    pf.name = fs::path(input).stem().string() + ".npy";
    pf.source = input;
    const std::vector<uint16_t> tokens = byte_tokenize(read_file(input), &pf.documents);
    pf.tokens = static_cast<int64_t>(tokens.size());
    const fs::path temp = out / ("." + pf.name + tmp_suffix);
    cleanup.temps.push_back(temp);
    write_npy(temp.string(), tokens);
    renames.emplace_back(temp, out / pf.name);
    files.push_back({{"name", pf.name}, {"tokens", pf.tokens}, {"documents", pf.documents}, {"source", input}});
    result.total_tokens += pf.tokens;
    result.files.push_back(std::move(pf));
  }

  nlohmann::ordered_json meta = {{"tokenizer", "byte"},   {"vocab_size", kByteVocabSize},
                                 {"eos_token_id", kByteEosTokenId}, {"dtype", "uint16"},
                                 {"files", files}};
  const fs::path meta_temp = out / (".dataset.json" + tmp_suffix);
  cleanup.temps.push_back(meta_temp);
  {
    std::ofstream os(meta_temp);
    MOE_CHECK(os.good(), "prepare: cannot write ", meta_temp.string(), ": ", std::strerror(errno));
    os << meta.dump(2) << "\n";
    os.close();
    MOE_CHECK(!os.fail(), "prepare: writing ", meta_temp.string(), " failed");
  }
  renames.emplace_back(meta_temp, out / "dataset.json");  // last: its presence marks a complete folder

  // Check every target before renaming any, so a folder in the way cannot leave half a dataset.
  for (const auto& [temp, final_path] : renames) {
    std::error_code ec;
    MOE_CHECK(!fs::is_directory(final_path, ec), "prepare: ", final_path.string(),
              " is a folder; cannot write the token file there");
  }
  for (const auto& [temp, final_path] : renames) {
    std::error_code ec;
    fs::rename(temp, final_path, ec);
    MOE_CHECK(!ec, "prepare: cannot rename ", temp.string(), " to ", final_path.string(), ": ", ec.message());
  }
  cleanup.armed = false;
  return result;
}

}  // namespace moe

#include "moe/data/token_folder.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>

#include "moe/core/bounded_json.h"
#include "moe/core/error.h"
#include "moe/core/printable.h"

namespace moe {

namespace fs = std::filesystem;

std::string file_name_list(const std::vector<std::string>& names, size_t shown) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < shown; ++i) text += (i ? ", " : "") + names[i];
  if (names.size() > shown) text += " and " + std::to_string(names.size() - shown) + " more";
  return text;
}

void refuse_unlisted(const std::vector<std::string>& unlisted, const std::string& dataset_json) {
  if (unlisted.empty()) return;
  const bool one = unlisted.size() == 1;
  try {
    MOE_FAIL(one ? "token file " : "token files ", file_name_list(unlisted), one ? " is" : " are", " not listed in ",
             dataset_json, ", which names the files of this dataset, and unlisted files are neither read nor ",
             "skipped silently: move ", one ? "it" : "them", " out of the folder, or, if ",
             one ? "it belongs" : "they belong", " to the dataset, delete ", one ? "it" : "them", " and add ",
             one ? "its" : "their", " text again with `prepare --append`");
  } catch (const Error& e) {
    throw UnlistedTokenFiles(e.what(), fs::path(dataset_json).parent_path().string());
  }
}

nlohmann::ordered_json read_dataset_json(const std::string& path) {
  std::error_code ec;
  MOE_CHECK(!fs::is_directory(path, ec), path, " is a directory, not a file: a folder's dataset.json is the list of "
            "its token files that prepare writes; move the directory away");
  std::ifstream in(path);
  MOE_CHECK(in.good(), "cannot read ", path, ": ", std::strerror(errno));
  nlohmann::ordered_json meta;
  try {
    meta = parse_bounded_json<nlohmann::ordered_json>(in, path);
  } catch (const nlohmann::json::exception& e) {
    MOE_FAIL(path, " is not valid JSON (", e.what(),
             "); it should list the folder's token files, as prepare writes it");
  } catch (const Error&) {
    throw;  // named already (a file nested too deep)
  } catch (const std::exception& e) {  // a read error of the stream (an unreadable special file)
    MOE_FAIL("cannot read ", path, ": ", e.what());
  }
  MOE_CHECK(meta.is_object(), path, " is not a JSON object; it should list the folder's token files under \"files\"");
  MOE_CHECK(meta.contains("files"), path, " has no \"files\" (the list of the folder's token files)");
  const nlohmann::ordered_json& files = meta["files"];
  MOE_CHECK(files.is_array() && !files.empty(), path,
            ": \"files\" must be a non-empty array of {\"name\": ...} objects, got ", files.dump());
  std::set<std::string> seen;
  for (size_t i = 0; i < files.size(); ++i) {
    const nlohmann::ordered_json& f = files[i];
    const std::string field = "files[" + std::to_string(i) + "]";
    MOE_CHECK(f.is_object() && f.contains("name") && f["name"].is_string(), path, ": \"", field,
              "\" must be an object with a \"name\" string, got ", f.dump());
    const std::string name = f["name"].get<std::string>();
    MOE_CHECK(!name.empty() && fs::path(name).filename() == name && name != "." && name != ".." &&
                  fs::path(name).extension() == ".npy",
              path, ": \"", field, ".name\" is \"", printable(name), "\", not a file name ending in .npy inside the folder");
    MOE_CHECK(seen.insert(name).second, path, ": \"", field, ".name\" lists ", printable(name), " a second time");
    if (f.contains("tokens"))
      MOE_CHECK(f["tokens"].is_number_integer() && f["tokens"].get<int64_t>() >= 0, path, ": \"", field,
                ".tokens\" must be an integer >= 0, got ", f["tokens"].dump());
  }
  // Optional, but when given what prepare and tokenize_hf.py write (a string or a float here means
  // another writer): readers compare them with the model and the files' headers.
  for (const auto& [key, least] : {std::pair<const char*, int64_t>{"vocab_size", 1}, {"eos_token_id", 0}})
    MOE_CHECK(!meta.contains(key) || (meta[key].is_number_integer() && meta[key].get<int64_t>() >= least), path,
              ": \"", key, "\" is ", meta.contains(key) ? meta[key].dump() : "", "; expected an integer >= ", least);
  MOE_CHECK(!meta.contains("dtype") ||
                (meta["dtype"].is_string() && (meta["dtype"] == "uint16" || meta["dtype"] == "uint32")),
            path, ": \"dtype\" is ", meta.contains("dtype") ? meta["dtype"].dump() : "",
            "; expected \"uint16\" or \"uint32\"");
  return meta;
}

std::vector<TokenFile> list_token_files(const std::string& folder, const std::string& key) {
  const fs::path dir(folder);
  std::vector<std::string> npy_on_disk;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".npy" && entry.is_regular_file(ec))
      npy_on_disk.push_back(entry.path().filename().string());
  std::sort(npy_on_disk.begin(), npy_on_disk.end());

  std::vector<TokenFile> files;
  const fs::path meta_path = dir / "dataset.json";
  if (!fs::exists(meta_path, ec)) {
    MOE_CHECK(!npy_on_disk.empty(), key, ": folder '", folder, "' contains no .npy token files");
    for (const std::string& name : npy_on_disk) files.push_back({(dir / name).string(), std::nullopt, ""});
    return files;
  }

  const nlohmann::ordered_json meta = read_dataset_json(meta_path.string());
  std::set<std::string> listed;
  for (const auto& f : meta["files"]) {
    const std::string name = f["name"].get<std::string>();
    listed.insert(name);
    const fs::path file = dir / name;
    MOE_CHECK(fs::is_regular_file(file, ec), meta_path.string(), " lists ", name, ", but ", file.string(),
              fs::exists(file, ec) ? " is not a regular file" : " does not exist",
              "; restore it, or prepare the dataset again into a new folder");
    files.push_back({file.string(),
                     f.contains("tokens") ? std::optional<int64_t>(f["tokens"].get<int64_t>()) : std::nullopt,
                     meta_path.string()});
  }
  std::vector<std::string> unlisted;
  for (const std::string& name : npy_on_disk)
    if (!listed.count(name)) unlisted.push_back((dir / name).string());
  refuse_unlisted(unlisted, meta_path.string());
  std::sort(files.begin(), files.end(), [](const TokenFile& a, const TokenFile& b) { return a.path < b.path; });
  return files;
}

}  // namespace moe

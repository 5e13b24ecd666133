#include "moe/data/token_sources.h"

#include <fnmatch.h>
#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include <xxhash.h>

#include "moe/core/error.h"
#include "moe/core/printable.h"
#include "moe/data/megatron_index.h"
#include "moe/data/prepare_lock.h"
#include "moe/data/token_folder.h"

namespace moe {

namespace fs = std::filesystem;

namespace {

// glob()'s error callback has no context argument: the first folder it could not read is kept
// here (per thread), so the message can name it.
thread_local std::string t_glob_failed_folder;
thread_local int t_glob_errno = 0;

int record_glob_error(const char* folder, int error) {
  if (t_glob_failed_folder.empty()) {
    t_glob_failed_folder = folder;
    t_glob_errno = error;
  }
  return 1;  // stop: a folder the pattern reaches but cannot read is an error, not fewer files
}

// The regular files a glob matches, or an error naming the pattern: no match at all, a folder in
// the pattern that is missing or unreadable, or matches that are all folders or special files.
std::vector<std::string> glob_files(const std::string& pattern, const std::string& key) {
  t_glob_failed_folder.clear();
  t_glob_errno = 0;
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, record_glob_error, &g);
  std::vector<std::string> files, others;
  std::error_code ec;
  for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i)
    (fs::is_regular_file(g.gl_pathv[i], ec) ? files : others).push_back(g.gl_pathv[i]);
  globfree(&g);
  const std::string named = key + " = \"" + printable(pattern) + "\"";
  if (rc == GLOB_ABORTED) {
    const std::string& folder = t_glob_failed_folder;
    MOE_CHECK(t_glob_errno != ENOENT, named, " matches no token file: the folder ", printable(folder),
              " does not exist");
    MOE_FAIL(named, ": the glob cannot read the folder ", printable(folder), " (", std::strerror(t_glob_errno), ")");
  }
  MOE_CHECK(rc != GLOB_NOSPACE, named, ": out of memory while expanding the glob");
  MOE_CHECK(rc == 0 || rc == GLOB_NOMATCH, named, ": the glob could not be expanded (glob() returned ", rc, ")");
  MOE_CHECK(rc != GLOB_NOMATCH, named, " matches no token file: no path matches the pattern");
  MOE_CHECK(!files.empty(), named, " matches no token file: ",
            others.size() == 1 ? "its one match, " : "its matches, ", printable(file_name_list(others)),
            others.size() == 1 ? ", is a folder or a special file" : ", are folders or special files");
  return files;
}

// A folder's dataset.json, read once, for the files a glob or a file path names inside it.
struct FolderListing {
  std::string dataset_json;                    // "" when the folder has none
  std::map<std::string, std::optional<int64_t>> listed;  // name -> its "tokens"
};

FolderListing folder_listing(const fs::path& folder) {
  FolderListing l;
  std::error_code ec;
  const fs::path meta_path = folder / "dataset.json";
  if (!fs::exists(fs::symlink_status(meta_path, ec))) return l;
  l.dataset_json = meta_path.string();
  const nlohmann::ordered_json meta = read_dataset_json(l.dataset_json);
  for (const auto& f : meta["files"])
    l.listed[f["name"].get<std::string>()] =
        f.contains("tokens") ? std::optional<int64_t>(f["tokens"].get<int64_t>()) : std::nullopt;
  return l;
}

// The .npy files of a glob (or one file path, as a glob of itself) held to the dataset.json of
// their folders; other files in such a folder are not token data (as in the folder itself).
std::vector<TokenFile> held_to_dataset_json(const std::vector<std::string>& matches, const std::string& pattern,
                                            bool is_glob, const std::string& key) {
  // folder -> its matches, each as (file name, the path as matched or given)
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> by_folder;
  for (const std::string& m : matches) {
    const fs::path p(m);
    by_folder[p.parent_path().string()].emplace_back(p.filename().string(), m);
  }
  const std::string last_component = fs::path(pattern).filename().string();
  std::vector<TokenFile> files;
  std::error_code ec;
  for (const auto& [folder, named] : by_folder) {
    const FolderListing l = folder_listing(folder.empty() ? fs::path(".") : fs::path(folder));
    if (l.dataset_json.empty()) {
      for (const auto& [name, path] : named) files.push_back({path, std::nullopt, ""});
      continue;
    }
    std::vector<std::string> unlisted;
    for (const auto& [name, path] : named) {
      if (fs::path(name).extension() != ".npy") {
        if (!is_glob) files.push_back({path, std::nullopt, ""});  // named as it is: read as asked
        continue;
      }
      const auto it = l.listed.find(name);
      if (it == l.listed.end()) {
        unlisted.push_back(path);
        continue;
      }
      files.push_back({path, it->second, l.dataset_json});
    }
    refuse_unlisted(unlisted, l.dataset_json);
    // A listed file that the pattern would pick but that is gone is lost data, as in the folder.
    if (!is_glob || last_component.empty()) continue;
    for (const auto& [name, tokens] : l.listed) {
      const fs::path listed_path = fs::path(folder) / name;
      MOE_CHECK(::fnmatch(last_component.c_str(), name.c_str(), FNM_PERIOD) != 0 ||
                    fs::is_regular_file(listed_path, ec),
                l.dataset_json, " lists ", printable(name), ", which ", key, " = \"", printable(pattern),
                "\" matches, but ", printable(listed_path.string()),
                fs::exists(listed_path, ec) ? " is not a regular file" : " does not exist",
                "; restore it, or prepare the dataset again into a new folder");
    }
  }
  return files;
}

// One pass over a file's tokens, parallel (token files can be large): the index of the first token
// >= vocab_size (-1: none) and an XXH3-64 checksum of its token bytes, by which ranks that opened
// node-local copies compare contents. The checksum is of fixed 4 MiB chunks' checksums, so it is
// the same whatever the thread count.
struct TokenScan {
  int64_t first_out_of_vocab = -1;
  uint64_t checksum = 0;
};

TokenScan scan_tokens(const TokenArray& file, int64_t vocab_size) {
  constexpr int64_t kChunkBytes = int64_t{4} << 20;
  const int64_t n = file.size(), token_bytes = file.dtype() == TokenDType::U16 ? 2 : 4;
  const int64_t bytes = n * token_bytes, per_chunk = kChunkBytes / token_bytes;
  const int64_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  const bool check_vocab = !(file.dtype() == TokenDType::U16 && vocab_size > 65535);
  std::vector<XXH64_hash_t> chunk_sums(static_cast<size_t>(chunks));
  int64_t first_bad = n;
#pragma omp parallel for schedule(dynamic, 1) reduction(min : first_bad)  // a chunk each: small files spread too
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * per_chunk, end = std::min(n, begin + per_chunk);
    chunk_sums[static_cast<size_t>(c)] =
        XXH3_64bits(file.bytes() + begin * token_bytes, static_cast<size_t>((end - begin) * token_bytes));
    if (check_vocab)
      for (int64_t i = begin; i < end; ++i)
        if (static_cast<int64_t>(file.at(i)) >= vocab_size) {
          first_bad = std::min(first_bad, i);
          break;
        }
  }
  return {first_bad == n ? -1 : first_bad, XXH3_64bits(chunk_sums.data(), chunk_sums.size() * sizeof(XXH64_hash_t))};
}

// source_files without a folder lock (below).
std::vector<TokenFile> source_files_once(const std::string& path, const std::string& format, const std::string& key);

}  // namespace

std::vector<TokenFile> source_files(const std::string& path, const std::string& format, const std::string& key) {
  // A prepare or tokenize_hf.py writing into a folder renames its new token files in before the
  // dataset.json that lists them (or, in a new folder, before it writes one at all), holding the
  // folder's lock meanwhile (data/prepare_lock.h): a folder is listed under a shared lock. Other
  // paths (a file, a glob) name their folders only once listed: files found unlisted there are
  // listed again under that folder's lock, and refused only if they still are.
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const FolderReadLock lock{fs::path(path)};
    return source_files_once(path, format, key);
  }
  try {
    return source_files_once(path, format, key);
  } catch (const UnlistedTokenFiles& e) {
    const FolderReadLock lock{e.folder.empty() ? fs::path(".") : fs::path(e.folder)};
    return source_files_once(path, format, key);
  }
}

namespace {

std::vector<TokenFile> source_files_once(const std::string& path, const std::string& format, const std::string& key) {
  MOE_CHECK(!path.empty(), key, " is empty: give a token file, a folder or a glob");
  std::vector<TokenFile> files;
  std::error_code ec;
  if (path.find_first_of("*?[") != std::string::npos) {
    const std::vector<std::string> matches = glob_files(path, key);
    if (format == "npy") {
      files = held_to_dataset_json(matches, path, /*is_glob=*/true, key);
      MOE_CHECK(!files.empty(), key, " = \"", printable(path), "\" matches no token file: its matches (",
                printable(file_name_list(matches)), ") lie in folders with a dataset.json, which lists .npy files "
                "only");
    } else {
      for (const std::string& m : matches) files.push_back({m, std::nullopt, ""});
    }
  } else if (fs::is_directory(path, ec)) {
    // A token-file name that is not a readable file (a broken link, a folder) is never skipped quietly.
    for (const auto& e : fs::directory_iterator(path)) {
      const std::string ext = e.path().extension().string();
      MOE_CHECK(!(ext == ".npy" || (format == "raw" && ext == ".bin")) || e.is_regular_file(ec), key, " = \"", path,
                "\": ", e.path().string(), " is not a readable token file (a folder, a broken link or a special "
                "file); move it away");
    }
    if (format == "npy") {
      files = list_token_files(path, key);
    } else {
      MOE_CHECK(!fs::exists(fs::symlink_status(fs::path(path) / "dataset.json", ec)), key, " = \"", path,
                "\": the folder holds a dataset.json, so prepare or tokenize_hf.py wrote it, as .npy files with "
                "headers; data.format = \"raw\" would read each header as tokens. Use data.format = \"npy\" "
                "(--set data.format=npy)");
      for (const auto& e : fs::directory_iterator(path)) {
        const std::string ext = e.path().extension().string();
        if ((ext == ".npy" || ext == ".bin") && e.is_regular_file(ec)) files.push_back({e.path().string(), std::nullopt, ""});
      }
      MOE_CHECK(!files.empty(), key, " = \"", path, "\": the folder holds no raw token files (*.npy, *.bin)");
    }
  } else {
    MOE_CHECK(fs::exists(path, ec), key, " = \"", path, "\" does not exist");
    MOE_CHECK(fs::is_regular_file(path, ec), key, " = \"", path, "\" is neither a token file nor a folder");
    if (format == "npy")
      files = held_to_dataset_json({path}, path, /*is_glob=*/false, key);
    else
      files.push_back({path, std::nullopt, ""});
  }
  std::sort(files.begin(), files.end(), [](const TokenFile& a, const TokenFile& b) { return a.path < b.path; });
  return files;
}

}  // namespace

std::vector<TokenArray> open_token_files(const std::string& path, const std::string& format, TokenDType raw_dtype,
                                         const std::string& key, int64_t vocab_size,
                                         std::optional<int64_t> eos_token_id, std::vector<std::string>* warnings,
                                         std::vector<uint64_t>* checksums) {
  const std::vector<TokenFile> files = source_files(path, format, key);
  // A prepared folder says which tokenizer wrote it: its ids must fit this model.
  std::set<std::string> checked;
  std::map<std::string, std::string> listed_dtype;  // dataset.json -> its "dtype", when it gives one
  for (const TokenFile& f : files) {
    if (f.dataset_json.empty() || !checked.insert(f.dataset_json).second) continue;
    const nlohmann::ordered_json j = read_dataset_json(f.dataset_json);
    // read_dataset_json checked the types of dtype, vocab_size and eos_token_id.
    if (j.contains("dtype")) listed_dtype[f.dataset_json] = j["dtype"].get<std::string>();
    if (j.contains("vocab_size"))
      MOE_CHECK(j["vocab_size"].get<int64_t>() <= vocab_size, f.dataset_json, ": the tokenizer's vocab_size ",
                j["vocab_size"].get<int64_t>(), " is larger than model.vocab_size = ", vocab_size,
                ": this data was tokenized for another model");
    if (eos_token_id && warnings && j.contains("eos_token_id") && j["eos_token_id"].get<int64_t>() != *eos_token_id)
      warnings->push_back(f.dataset_json + ": the tokenizer's eos_token_id " +
                          std::to_string(j["eos_token_id"].get<int64_t>()) + " is not model.eos_token_id = " +
                          std::to_string(*eos_token_id) + " (exported Hugging Face configs will name the model's)");
  }
  std::vector<TokenArray> arrays;
  for (const TokenFile& listed : files) {
    const std::string& name = listed.path;
    TokenArray file = TokenArray::open(name, format, raw_dtype);
    MOE_CHECK(!listed.listed_tokens || *listed.listed_tokens == file.size(), name, " holds ", file.size(),
              " tokens, but ", listed.dataset_json, " lists it with ", listed.listed_tokens.value_or(0),
              ": the file changed after dataset.json was written; prepare the dataset again into a new folder");
    // The .npy header is what the reader follows; a dataset.json that says otherwise describes other files.
    if (const auto d = listed_dtype.find(listed.dataset_json); d != listed_dtype.end())
      MOE_CHECK(d->second == token_dtype_name(file.dtype()), name, " holds ", token_dtype_name(file.dtype()),
                " tokens (its .npy header), but ", listed.dataset_json, " says \"dtype\": \"", d->second,
                "\": the file changed after dataset.json was written; prepare the dataset again into a new folder");
    const TokenScan scan = scan_tokens(file, vocab_size);
    const int64_t bad = scan.first_out_of_vocab;
    MOE_CHECK(bad < 0, name, ": token ", (bad < 0 ? 0 : file.at(bad)), " at index ", bad,
              " is outside the model vocabulary (vocab_size ", vocab_size, ")",
              format == "raw" ? " (for raw files, check data.dtype)" : "");
    // Windows see document boundaries only as EOS tokens; a Megatron .bin written without
    // --append-eod has none, and its documents would run into each other unmarked.
    if (format == "raw" && eos_token_id && warnings) {
      const std::vector<int64_t> ends = megatron_document_ends(name, raw_dtype, 64);
      int64_t without = 0;
      for (int64_t e : ends) without += e < file.size() && file.at(e) != static_cast<uint32_t>(*eos_token_id);
      if (without * 2 > static_cast<int64_t>(ends.size()))
        warnings->push_back(name + ": " + std::to_string(without) + " of the " + std::to_string(ends.size()) +
                            " documents checked (by its Megatron index) do not end with model.eos_token_id = " +
                            std::to_string(*eos_token_id) +
                            ", so training windows run across documents unmarked; Megatron-LM's preprocess_data.py "
                            "writes the EOS with --append-eod (or set model.eos_token_id to the tokenizer's)");
    }
    arrays.push_back(std::move(file));
    if (checksums) checksums->push_back(scan.checksum);
  }
  return arrays;
}

}  // namespace moe

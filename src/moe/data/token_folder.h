// Which token files a data folder holds. A folder written by `moetrain prepare` or
// python/tokenize_hf.py has a dataset.json that lists its files:
//   {"tokenizer": "...", "vocab_size": V, "eos_token_id": E, "dtype": "uint16" | "uint32",
//    "files": [{"name": "<stem>.npy", "tokens": N, "documents": D, "source": "<input path>"}, ...]}
// When it is present it is the authority: the folder's data is exactly the files it lists. A
// listed file that is missing, and a .npy file it does not list (a leftover of an earlier
// prepare, a file copied in by hand), are errors, so data is never silently mixed in or left
// out. A folder without dataset.json (written by hand) holds every .npy file in it.
#pragma once

#include "moe/core/error.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace moe {

struct TokenFile {
  std::string path;                      // <folder>/<name>
  std::optional<int64_t> listed_tokens;  // its "tokens" in dataset.json, when it has one
  std::string dataset_json;              // the dataset.json that lists it ("" when its folder has none)
};

// Parses the dataset.json at `path` and checks what readers rely on: a JSON object whose
// "files" is a non-empty array of objects with a "name" (a plain file name ending in .npy, each
// name once) and optionally "tokens" (an integer >= 0); "vocab_size" (an integer >= 1),
// "eos_token_id" (an integer >= 0) and "dtype" ("uint16" or "uint32") when present. Other keys
// are returned unchecked.
// Throws moe::Error naming the file and the field (and saying so when `path` is a folder).
nlohmann::ordered_json read_dataset_json(const std::string& path);

// The token files of `folder` in file-name order (the order training draws windows in, with or
// without dataset.json): the files <folder>/dataset.json lists, or, without one, every .npy
// file. Throws moe::Error naming dataset.json and the file when a listed file is missing or a
// .npy file is not listed, and naming the folder and `key` (the config key or flag that gave it:
// "data.path", "--data", "eval.sets[0].path") when it holds no token files.
std::vector<TokenFile> list_token_files(const std::string& folder, const std::string& key);

// What refuse_unlisted throws: `folder` holds the dataset.json that does not list the files.
class UnlistedTokenFiles : public Error {
 public:
  UnlistedTokenFiles(const std::string& what, std::string folder_) : Error(what), folder(std::move(folder_)) {}
  const std::string folder;
};

// Throws UnlistedTokenFiles naming the token files (paths) that `dataset_json` does not list, and
// how to fix that; returns when there are none.
void refuse_unlisted(const std::vector<std::string>& unlisted, const std::string& dataset_json);

// "a, b, c" for at most `shown` names, then "and N more": file names in an error message.
std::string file_name_list(const std::vector<std::string>& names, size_t shown = 5);

}  // namespace moe

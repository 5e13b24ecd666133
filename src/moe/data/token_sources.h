// Which token files one data path names, and opening them: a file, a folder or a glob
// ("data/*.npy"), in name order.
//
// A folder of .npy files follows its dataset.json (token_folder.h). A file or a glob's match that
// lies in a folder with a dataset.json is held to it as the folder's own files are: it must be
// listed (an unlisted match is an error, as in the folder), a listed file that the glob's last
// component would match must exist, its token count must be the listed one, and the tokenizer's
// vocab_size must fit the model. A glob picks part of a dataset: listed files it does not match
// are not read. A glob that matches nothing, or whose folder is missing or unreadable, is an error
// naming the pattern.
//
// A folder of raw files (data.format = "raw") holds its *.npy and *.bin files (OLMo-core and
// Dolma write raw token arrays under .npy names); a folder with a dataset.json is refused in raw
// mode (prepare and tokenize_hf.py wrote it, in .npy files with headers), and so is any raw file
// that starts with the .npy magic (TokenArray::open_raw). A path that names no file is an error
// naming it and its key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moe/data/token_array.h"
#include "moe/data/token_folder.h"

namespace moe {

// format: "npy" or "raw" (data.format). `key` names the config key or flag for messages
// ("data.path", "--data", "eval.sets[0].path"). A file listed in a dataset.json carries its
// listed token count and that dataset.json (for the reader to check).
std::vector<TokenFile> source_files(const std::string& path, const std::string& format, const std::string& key);

// The files source_files lists, memory-mapped (raw files as raw_dtype) and checked as `train`
// and `eval` both read them: a dataset.json whose tokenizer vocab_size exceeds `vocab_size` is
// refused; a file must hold the token count its dataset.json lists; every token must be
// < vocab_size (the error names the file, index and value). With an eos_token_id, a dataset.json
// that names another EOS adds a line to `warnings` (when given). `checksums` (when given) gets each
// file's XXH3-64 checksum of its token bytes, from the same pass over the tokens as the check.
std::vector<TokenArray> open_token_files(const std::string& path, const std::string& format, TokenDType raw_dtype,
                                         const std::string& key, int64_t vocab_size,
                                         std::optional<int64_t> eos_token_id = std::nullopt,
                                         std::vector<std::string>* warnings = nullptr,
                                         std::vector<uint64_t>* checksums = nullptr);

}  // namespace moe

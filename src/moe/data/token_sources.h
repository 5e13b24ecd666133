// Which token files one data path names: a file, a folder or a glob ("data/*.npy"), in name
// order. A folder of .npy files follows its dataset.json (token_folder.h); a folder of raw
// files (data.format = "raw") holds its *.npy and *.bin files (OLMo-core and Dolma write raw
// token arrays under .npy names). A path that names no file is an error naming it.
#pragma once

#include <string>
#include <vector>

#include "moe/data/token_folder.h"

namespace moe {

// format: "npy" or "raw" (data.format). `key` names the config key for messages. A file listed
// in a dataset.json carries its listed token count (for the reader to check).
std::vector<TokenFile> source_files(const std::string& path, const std::string& format, const std::string& key);

}  // namespace moe

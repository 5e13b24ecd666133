// Start-up check that every rank of a job opened the same token data. Ranks that read node-local
// copies that differ (other files, or the same files with other tokens), or a folder that changed
// between two ranks' listings, would each train or evaluate on their own windows without a word;
// one small collective finds it first.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "moe/comm/communicator.h"
#include "moe/data/dataset.h"
#include "moe/data/eval_windows.h"

namespace moe {

// What a rank opened, for comparing ranks: the number of files and tokens, and a checksum of every
// file's name, lengths and token bytes (each file's checksum comes from the pass that checked its
// tokens when it was opened: token_sources.h).
std::string token_data_summary(const TokenDataset& data);
std::string token_data_summary(const EvalWindows& windows);

// The training token files for a checkpoint's train_state.json: [{"file", "tokens", "xxh3"}] in
// the dataset's order (the synthetic stream is not a file: not listed).
nlohmann::json token_files_record(const TokenDataset& data);
// What differs between a checkpoint's record and the files this run opened: "F changed", "F is
// new", "F is gone" (at most a few named, then how many more), or "" when nothing does. A record
// that is not the form token_files_record writes gives "".
std::string token_files_changes(const nlohmann::json& record, const TokenDataset& now);

// Collective over `host`: every rank compares its summary with rank 0's; when one differs, every
// rank throws the same AgreedError naming `what` ("token data", "token data for eval.sets[0]")
// and what rank 0 and the first differing rank read.
void check_same_token_data(Communicator& host, const std::string& summary, const std::string& what);

}  // namespace moe

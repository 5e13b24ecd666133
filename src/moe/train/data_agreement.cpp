#include "moe/train/data_agreement.h"

#include <filesystem>
#include <map>
#include <vector>

#include "moe/ckpt/checksum.h"
#include "moe/comm/host_strings.h"
#include "moe/core/error.h"

namespace moe {

namespace {

std::string summary_of(const std::string& listing, size_t files, int64_t tokens) {
  return std::to_string(files) + " token file" + (files == 1 ? "" : "s") + " of " + std::to_string(tokens) +
         " tokens (checksum of their names, lengths and tokens " +
         checksum_hex(checksum_bytes(listing.data(), listing.size())) + ")";
}

// A file's entry of token_files_record as "tokens xxh3": what the windows read from it.
std::string contents_of(const nlohmann::json& f) {
  return std::to_string(f["tokens"].get<int64_t>()) + " " + f["xxh3"].get<std::string>();
}

}  // namespace

std::string token_data_summary(const TokenDataset& data) {
  std::string listing;
  int64_t tokens = 0;
  for (const TokenDataset::File& f : data.files()) {
    listing += f.name + "\t" + std::to_string(f.train_length) + "\t" + std::to_string(f.eval_length) + "\t" +
               checksum_hex(f.checksum) + "\n";
    tokens += f.train_length + f.eval_length;
  }
  return summary_of(listing, data.files().size(), tokens);
}

nlohmann::json token_files_record(const TokenDataset& data) {
  nlohmann::json files = nlohmann::json::array();
  if (data.attainable_loss()) return files;  // the synthetic corpus (never mixed with files): no file
  for (const TokenDataset::File& f : data.files()) {
    std::error_code ec;
    const std::filesystem::path canonical = std::filesystem::weakly_canonical(f.name, ec);
    files.push_back({{"file", ec ? f.name : canonical.string()},
                     {"tokens", f.train_length + f.eval_length},
                     {"xxh3", checksum_hex(f.checksum)}});
  }
  return files;
}

std::string token_files_changes(const nlohmann::json& record, const TokenDataset& now) {
  if (!record.is_array()) return "";
  for (const nlohmann::json& f : record)
    if (!f.is_object() || !f.contains("file") || !f["file"].is_string() || !f.contains("tokens") ||
        !f["tokens"].is_number_integer() || !f.contains("xxh3") || !f["xxh3"].is_string())
      return "";
  const nlohmann::json current = token_files_record(now);
  // The same contents in the same order read the same windows, wherever the files now lie (data
  // moved to node-local disk, a folder given by another path).
  std::vector<std::string> was, is;
  for (const nlohmann::json& f : record) was.push_back(contents_of(f));
  for (const nlohmann::json& f : current) is.push_back(contents_of(f));
  if (was == is) return "";
  std::map<std::string, std::string> before, after;  // file -> contents
  for (const nlohmann::json& f : record) before[f["file"].get<std::string>()] = contents_of(f);
  for (const nlohmann::json& f : current) after[f["file"].get<std::string>()] = contents_of(f);
  std::vector<std::string> changes;
  for (const auto& [file, contents] : before) {
    const auto it = after.find(file);
    if (it == after.end())
      changes.push_back(file + " is gone");
    else if (it->second != contents)
      changes.push_back(file + " changed");
  }
  for (const auto& [file, contents] : after)
    if (!before.count(file)) changes.push_back(file + " is new");
  if (changes.empty()) return "the same files in another order";
  constexpr size_t kNamed = 4;
  std::string out;
  for (size_t i = 0; i < changes.size() && i < kNamed; ++i) out += (i ? ", " : "") + changes[i];
  if (changes.size() > kNamed) out += " and " + std::to_string(changes.size() - kNamed) + " more";
  return out;
}

std::string token_data_summary(const EvalWindows& windows) {
  std::string listing;
  int64_t tokens = 0;
  for (size_t k = 0; k < windows.files().size(); ++k) {
    listing += windows.files()[k].path() + "\t" + std::to_string(windows.files()[k].size()) + "\t" +
               checksum_hex(windows.checksums()[k]) + "\n";
    tokens += windows.files()[k].size();
  }
  return summary_of(listing, windows.files().size(), tokens);
}

void check_same_token_data(Communicator& host, const std::string& summary, const std::string& what) {
  const StringAgreement same = agree_on_string(host, summary);
  MOE_CHECK_AGREED(same.differing_rank < 0, "the ranks opened different ", what, ": rank 0 read ", same.leader,
                   ", rank ", same.differing_rank, " ", same.differing,
                   "; every rank must see the same files (on several nodes, the same dataset folder); start the job "
                   "again once they do");
}

}  // namespace moe

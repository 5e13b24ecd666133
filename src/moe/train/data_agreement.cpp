#include "moe/train/data_agreement.h"

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

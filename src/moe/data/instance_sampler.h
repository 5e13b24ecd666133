// Epoch sampling (data.sampling = "epoch", the default), as OLMo-core does it: every usable file
// of a source is cut into fixed instances of seq_len + 1 tokens (non-overlapping, from the start
// of its training split; a remainder shorter than an instance is unused), and training reads
// them in an order shuffled per epoch from the seed.
//
// Mixture: an epoch holds k_s = max(1, round(w_s / sum(w) x N)) instances of source s, N being
// the instances of all sources together, so with weights proportional to the sources' sizes
// every instance is read once per epoch. Each source is read as a sequence of passes, each pass
// a fresh shuffle of all its instances: a source with more instances than its share contributes
// the next k_s of its pass every epoch (every instance before any repeats), a source with fewer
// is repeated (upsampled). The epoch's instances are then shuffled together.
//
// Global sequence g = step x global_batch + j (j its index in the step's global batch) is
// position g mod E of epoch g / E (E = sum k_s); the order is a pure function of (data.seed, g),
// so it is the same on every topology and a resumed run continues exactly where it stopped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/data/dataset.h"

namespace moe {

class InstanceSampler {
 public:
  // check_window(seq_len) must have passed (every source has a usable file).
  InstanceSampler(const TokenDataset& data, int64_t seq_len, int64_t global_batch, uint64_t seed);

  // Sequences first_seq .. first_seq + n_seqs - 1 of optimizer step `step` into row-major
  // [n_seqs, seq_len] inputs and targets.
  void batch(int64_t step, int64_t first_seq, int64_t n_seqs, int32_t* inputs, int32_t* targets) const;

  int64_t epoch_size() const { return epoch_size_; }  // instances per epoch (E)
  // Epochs completed after `steps` optimizer steps (fractional).
  double epochs_after(int64_t steps) const;
  std::string describe() const;  // one line for the log

  // Where global sequence g comes from (exposed for tests): file index and start token.
  struct Instance {
    size_t file = 0;
    int64_t start = 0;
  };
  Instance instance(uint64_t g) const;

 private:
  struct SourceInstances {
    std::vector<size_t> files;           // usable files of the source
    std::vector<int64_t> first_instance;  // prefix sums of their instance counts (size files + 1)
    int64_t count = 0;                    // n_s
    int64_t per_epoch = 0;                // k_s
  };
  const TokenDataset& data_;
  int64_t seq_len_, global_batch_;
  uint64_t seed_;
  std::vector<SourceInstances> sources_;
  std::vector<int64_t> epoch_offsets_;  // prefix sums of k_s (size sources + 1)
  int64_t epoch_size_ = 0;
};

}  // namespace moe

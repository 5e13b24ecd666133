// TokenDataset: the token files of a run and their splits: the built-in synthetic corpus, or
// one or several sources (data.path, or [[data.sources]] with mixture weights), each a token
// file, a folder or a glob of .npy or raw files (memory-mapped). The last eval_fraction of every
// file is held out. Which training windows a step reads is decided by InstanceSampler (epoch
// order, data/instance_sampler.h) or, with data.sampling = "random", by train_batch below; both
// are pure functions of (seed, step, sequence index), so any data-parallel split of a global
// batch reads the same tokens and a resumed run reads what the uninterrupted run would have.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moe/data/data_config.h"
#include "moe/data/token_array.h"

namespace moe {

class TokenDataset {
 public:
  // Opens the configured sources ("synthetic" generates the train stream, stream id 0, and the
  // held-out stream, stream id 1, in memory). Every token is checked < vocab_size at open and the
  // error names the file, index and value; a source that names no file is an error naming its key.
  static TokenDataset open(const DataConfig& cfg, int64_t vocab_size, int64_t eos_token_id);

  // The files too short for one training window of seq_len + 1 tokens: they are left out of
  // sampling, and the returned lines say so (for a warning). Throws naming the source when none
  // of a source's files holds a window.
  std::vector<std::string> check_window(int64_t seq_len) const;

  // data.sampling = "random": global sequence j of optimizer step `step` is a window of
  // seq_len + 1 consecutive tokens chosen from (seed, step, j) alone: a source by its weight, a
  // file of it with probability proportional to its training-split length, then a uniform
  // start inside that split (windows never cross files or enter the held-out tail). Writes
  // inputs = w[0..seq_len) and targets = w[1..seq_len] of sequences first_seq ..
  // first_seq + n_seqs - 1 into row-major [n_seqs, seq_len] arrays.
  void train_batch(int64_t step, int64_t first_seq, int64_t n_seqs, int64_t seq_len, int32_t* inputs,
                   int32_t* targets) const;

  // Held-out split: non-overlapping windows of seq_len+1 tokens laid consecutively over each
  // file's held-out tail (files in order; a tail's remainder shorter than a window is unused).
  int64_t eval_num_sequences(int64_t seq_len) const;
  void eval_batch(int64_t first_seq, int64_t n_seqs, int64_t seq_len, int32_t* inputs, int32_t* targets) const;

  std::optional<double> attainable_loss() const { return attainable_loss_; }  // synthetic only
  // What open() found odd but not wrong (for warnings on the log).
  const std::vector<std::string>& warnings() const { return warnings_; }
  std::string describe() const;  // one line for the log: sources, files, tokens, splits
  int64_t train_tokens() const;
  int64_t eval_tokens() const;

  // One token file (or the synthetic stream) and its splits.
  struct File {
    std::string name;
    size_t source = 0;                         // index into mixture()
    int64_t train_begin = 0, train_length = 0;  // token range of the training split
    int64_t eval_begin = 0, eval_length = 0;    // token range of the held-out split
    uint64_t checksum = 0;  // XXH3-64 of the file's token bytes (open_token_files); 0 for the synthetic stream
  };
  // One training source of the mixture: its files and weight.
  struct Source {
    std::string key;  // the config key it came from ("data.path", "data.sources[1]")
    std::string path;
    double weight = 1;
    std::vector<size_t> files;  // indices into files()
  };
  const std::vector<File>& files() const { return files_; }
  const std::vector<Source>& mixture() const { return sources_; }
  int64_t vocab_size() const { return vocab_size_; }
  // inputs = tokens [start, start + seq_len) of file `file`, targets the same shifted by one.
  void copy_window(size_t file, int64_t start, int64_t seq_len, int32_t* inputs, int32_t* targets) const;

 private:
  uint32_t token(size_t file, int64_t i) const {
    return file < arrays_.size() ? arrays_[file].at(i) : synthetic_tokens_[static_cast<size_t>(i)];
  }

  DataConfig cfg_;
  int64_t vocab_size_ = 0;
  std::vector<File> files_;                 // arrays_ first, then at most one synthetic stream
  std::vector<Source> sources_;
  std::vector<TokenArray> arrays_;
  std::vector<uint32_t> synthetic_tokens_;  // train stream followed by held-out stream
  std::optional<double> attainable_loss_;
  std::string synthetic_summary_;
  std::vector<std::string> warnings_;
};

}  // namespace moe

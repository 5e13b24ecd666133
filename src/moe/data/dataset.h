// TokenDataset: the token source of a run, either the built-in synthetic corpus or a folder of
// .npy token files (memory-mapped). Training windows are a pure function of (seed, step,
// sequence index), so any data-parallel split of a global batch reads the same tokens, and a
// resumed run reads what the uninterrupted run would have read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moe/data/data_config.h"
#include "moe/data/npy.h"

namespace moe {

class TokenDataset {
 public:
  // Opens cfg.path: "synthetic" (generates the train stream, stream id 0, and the held-out
  // stream, stream id 1, in memory) or a folder of .npy token files: the files its dataset.json
  // lists, or every .npy file when it has none (token_folder.h), taken in file-name order,
  // memory-mapped; every token is checked < vocab_size at open and the error names the file,
  // index and value. Each file's last floor(eval_fraction * N) tokens are its held-out tail.
  static TokenDataset open(const DataConfig& cfg, int64_t vocab_size, int64_t eos_token_id);

  // Training windows: global sequence j (0 <= j < global batch) of optimizer step `step` is a
  // window of seq_len+1 consecutive tokens chosen from (seed, step, j) alone: a file with
  // probability proportional to its training-split length, then a uniform start inside that
  // file's training split (windows never cross files or enter the held-out tail). Writes
  // inputs = w[0..seq_len) and targets = w[1..seq_len] of sequences first_seq ..
  // first_seq+n_seqs-1 into row-major [n_seqs, seq_len] arrays. Throws, naming the file and the
  // needed length, if any file's training split is shorter than seq_len+1 tokens.
  void train_batch(int64_t step, int64_t first_seq, int64_t n_seqs, int64_t seq_len, int32_t* inputs,
                   int32_t* targets) const;

  // Held-out split: non-overlapping windows of seq_len+1 tokens laid consecutively over each
  // file's held-out tail (files in order; a tail's remainder shorter than a window is unused).
  // Throws naming the file when a training split is too short for a window of seq_len + 1 tokens.
  void check_window(int64_t seq_len) const;
  int64_t eval_num_sequences(int64_t seq_len) const;
  void eval_batch(int64_t first_seq, int64_t n_seqs, int64_t seq_len, int32_t* inputs, int32_t* targets) const;

  std::optional<double> attainable_loss() const { return attainable_loss_; }  // synthetic only
  std::string describe() const;  // one line for the log: source, files, tokens, splits
  int64_t train_tokens() const;
  int64_t eval_tokens() const;

  // One token source: a mapped file or the in-memory synthetic stream.
  struct Source {
    std::string name;
    int64_t train_begin = 0, train_length = 0;  // token range of the training split
    int64_t eval_begin = 0, eval_length = 0;    // token range of the held-out split
  };
  const std::vector<Source>& sources() const { return sources_; }
  int64_t vocab_size() const { return vocab_size_; }

 private:
  uint32_t token(size_t source, int64_t i) const {
    return source < files_.size() ? files_[source].at(i) : synthetic_tokens_[static_cast<size_t>(i)];
  }
  void copy_window(size_t source, int64_t start, int64_t seq_len, int32_t* inputs, int32_t* targets) const;

  DataConfig cfg_;
  int64_t vocab_size_ = 0;
  std::string path_;
  std::vector<Source> sources_;          // files_ first, then at most one synthetic source
  std::vector<NpyTokens> files_;
  std::vector<uint32_t> synthetic_tokens_;  // train stream followed by held-out stream
  std::vector<int64_t> train_cumulative_;   // prefix sums of train_length, size sources+1
  std::optional<double> attainable_loss_;
  std::string synthetic_summary_;
};

}  // namespace moe

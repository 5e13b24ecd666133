// Evaluation windows over token files: `moetrain eval` reads a .npy file, or the token files of
// a folder in name order (those its dataset.json lists: data/token_folder.h), as consecutive windows of seq_len + 1 tokens with stride seq_len, so
// each token after a window's first is predicted exactly once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/data/npy.h"

namespace moe {

class EvalWindows {
 public:
  // Checks every token is < vocab_size (the error names the file, index and value). Stops after
  // max_tokens predicted tokens (0 = all).
  static EvalWindows open(const std::string& path, int64_t seq_len, int64_t vocab_size, int64_t max_tokens);

  int64_t size() const { return static_cast<int64_t>(windows_.size()); }
  int64_t seq_len() const { return seq_len_; }
  // inputs = w[0..seq_len), targets = w[1..seq_len] of window i.
  void copy(int64_t i, int32_t* inputs, int32_t* targets) const;

 private:
  struct Window {
    size_t file;
    int64_t start;
  };
  int64_t seq_len_ = 0;
  std::vector<NpyTokens> files_;
  std::vector<Window> windows_;
};

}  // namespace moe

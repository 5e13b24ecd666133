// Evaluation windows over token files: `moetrain eval` and the named validation sets
// ([[eval.sets]]) read a file, a folder or a glob (token_sources.h) in name order as consecutive
// windows of seq_len + 1 tokens with stride seq_len, so each token after a window's first is
// predicted exactly once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/data/token_array.h"

namespace moe {

class EvalWindows {
 public:
  // Files in `format` ("npy" or "raw" of `dtype`), checked as training data is
  // (open_token_files: a folder's dataset.json, every token < vocab_size). Takes the whole
  // windows that fit in max_tokens predicted tokens (0 = all): at most max_tokens are predicted.
  // `key` names the path's origin in messages ("--data", "eval.sets[0].path").
  static EvalWindows open(const std::string& path, const std::string& format, TokenDType dtype, int64_t seq_len,
                          int64_t vocab_size, int64_t max_tokens, const std::string& key);

  int64_t size() const { return static_cast<int64_t>(windows_.size()); }
  int64_t seq_len() const { return seq_len_; }
  // inputs = w[0..seq_len), targets = w[1..seq_len] of window i.
  void copy(int64_t i, int32_t* inputs, int32_t* targets) const;
  // The files read, in order, and each one's XXH3-64 checksum of its token bytes.
  const std::vector<TokenArray>& files() const { return files_; }
  const std::vector<uint64_t>& checksums() const { return checksums_; }

 private:
  struct Window {
    size_t file;
    int64_t start;
  };
  int64_t seq_len_ = 0;
  std::vector<TokenArray> files_;
  std::vector<uint64_t> checksums_;
  std::vector<Window> windows_;
};

}  // namespace moe

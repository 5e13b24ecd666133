#include "moe/data/eval_windows.h"

#include "moe/core/error.h"
#include "moe/data/token_sources.h"

namespace moe {

EvalWindows EvalWindows::open(const std::string& path, const std::string& format, TokenDType dtype, int64_t seq_len,
                              int64_t vocab_size, int64_t max_tokens, const std::string& key) {
  MOE_CHECK(seq_len >= 1, "eval: seq_len must be >= 1, got ", seq_len);
  EvalWindows w;
  w.seq_len_ = seq_len;
  // Checked as `train` checks its data: a folder's dataset.json, its listed token counts, the vocabulary.
  w.files_ = open_token_files(path, format, dtype, key, vocab_size, std::nullopt, nullptr, &w.checksums_);
  int64_t predicted = 0;
  for (size_t k = 0; k < w.files_.size(); ++k) {
    const TokenArray& f = w.files_[k];
    for (int64_t start = 0; start + seq_len + 1 <= f.size(); start += seq_len) {
      if (max_tokens > 0 && predicted + seq_len > max_tokens) break;  // whole windows, at most max_tokens
      w.windows_.push_back({k, start});
      predicted += seq_len;
    }
  }
  return w;
}

void EvalWindows::copy(int64_t i, int32_t* inputs, int32_t* targets) const {
  MOE_CHECK(i >= 0 && i < size(), "eval window ", i, " outside the ", size(), " windows");
  const Window& w = windows_[static_cast<size_t>(i)];
  const TokenArray& f = files_[w.file];
  for (int64_t t = 0; t < seq_len_; ++t) {
    inputs[t] = static_cast<int32_t>(f.at(w.start + t));
    targets[t] = static_cast<int32_t>(f.at(w.start + t + 1));
  }
}

}  // namespace moe

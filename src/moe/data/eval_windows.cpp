#include "moe/data/eval_windows.h"

#include <filesystem>

#include "moe/core/error.h"
#include "moe/data/token_folder.h"

namespace moe {

namespace fs = std::filesystem;

EvalWindows EvalWindows::open(const std::string& path, int64_t seq_len, int64_t vocab_size, int64_t max_tokens) {
  MOE_CHECK(seq_len >= 1, "eval: seq_len must be >= 1, got ", seq_len);
  std::vector<std::string> paths;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const TokenFile& f : list_token_files(path)) paths.push_back(f.path);  // dataset.json rules
  } else {
    MOE_CHECK(fs::exists(path, ec), "eval: data '", path, "' does not exist");
    paths.push_back(path);
  }
  EvalWindows w;
  w.seq_len_ = seq_len;
  int64_t predicted = 0;
  for (const auto& p : paths) {
    w.files_.push_back(NpyTokens::open(p));
    const NpyTokens& f = w.files_.back();
    for (int64_t i = 0; i < f.size(); ++i)
      MOE_CHECK(f.at(i) < static_cast<uint64_t>(vocab_size), p, ": token ", f.at(i), " at index ", i,
                " is >= model.vocab_size = ", vocab_size);
    for (int64_t start = 0; start + seq_len + 1 <= f.size(); start += seq_len) {
      if (max_tokens > 0 && predicted >= max_tokens) break;
      w.windows_.push_back({w.files_.size() - 1, start});
      predicted += seq_len;
    }
  }
  return w;
}

void EvalWindows::copy(int64_t i, int32_t* inputs, int32_t* targets) const {
  MOE_CHECK(i >= 0 && i < size(), "eval window ", i, " outside the ", size(), " windows");
  const Window& w = windows_[static_cast<size_t>(i)];
  const NpyTokens& f = files_[w.file];
  for (int64_t t = 0; t < seq_len_; ++t) {
    inputs[t] = static_cast<int32_t>(f.at(w.start + t));
    targets[t] = static_cast<int32_t>(f.at(w.start + t + 1));
  }
}

}  // namespace moe

// EvalWindows (data/eval_windows.h): consecutive windows of seq_len + 1 tokens with stride
// seq_len over the files in name order, and a token budget that is a ceiling: `eval --tokens N`
// predicts at most N tokens, in whole windows.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "moe/data/eval_windows.h"
#include "moe/data/npy.h"
#include "../ckpt/temp_dir.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

class EvalWindowsTest : public ::testing::Test {
 protected:
  moe::testing::TempDir tmp_;  // removed with its files when the test ends
  fs::path dir_{tmp_.path};
};

}  // namespace

TEST_F(EvalWindowsTest, at_most_max_tokens_are_predicted_in_whole_windows) {
  std::vector<uint16_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i);
  write_npy((dir_ / "a.npy").string(), tokens);
  write_npy((dir_ / "b.npy").string(), tokens);
  const int64_t seq_len = 128;
  const auto windows = [&](int64_t max_tokens) {
    return EvalWindows::open(dir_.string(), "npy", TokenDType::U16, seq_len, 1000, max_tokens, "--data").size();
  };
  EXPECT_EQ(windows(0), 14);  // all: 7 windows of 129 tokens (stride 128) in each file
  EXPECT_EQ(windows(1000), 7);  // 7 x 128 = 896 <= 1000; an 8th window would predict 1024
  EXPECT_EQ(windows(1024), 8);
  EXPECT_EQ(windows(1023), 7);
  EXPECT_EQ(windows(127), 0);
  EXPECT_EQ(windows(128), 1);
  EXPECT_EQ(windows(1 << 30), 14);
  // The windows taken are the first ones, in file order: the budget cuts the tail.
  const EvalWindows w = EvalWindows::open(dir_.string(), "npy", TokenDType::U16, seq_len, 1000, 1000, "--data");
  std::vector<int32_t> in(seq_len), tg(seq_len);
  w.copy(6, in.data(), tg.data());
  EXPECT_EQ(in[0], 6 * 128);
  EXPECT_EQ(tg[seq_len - 1], 7 * 128);
}

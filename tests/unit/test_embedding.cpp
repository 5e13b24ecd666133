// Embedding lookup and accumulation (exact data movement).
#include <gtest/gtest.h>

#include <vector>

#include "moe/core/rng.h"
#include "moe/ops/embedding.h"

namespace {

using moe::f32_tensor;
using moe::i32_tensor;

std::vector<float> random_values(int64_t n, uint64_t seed) {
  moe::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t V, uint64_t seed) {
  moe::Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng.below(V));
  return t;
}

const int64_t kShapes[][3] = {{1, 1, 1}, {5, 7, 3}, {40, 11, 300}, {17, 1000, 64}};  // R, V, D

TEST(Embedding, EmbeddingForwardCopiesTableRowsExactly) {
  uint64_t seed = 1;
  for (const auto& s : kShapes) {
    const int64_t R = s[0], V = s[1], D = s[2];
    auto table = random_values(V * D, seed++);
    auto tokens = random_tokens(R, V, seed++);
    std::vector<float> out(R * D, -1.0f);
    moe::embedding_forward(f32_tensor(out.data(), {R, D}), f32_tensor(table.data(), {V, D}),
                           i32_tensor(tokens.data(), {R}));
    for (int64_t r = 0; r < R; ++r)
      for (int64_t d = 0; d < D; ++d) ASSERT_EQ(out[r * D + d], table[tokens[r] * D + d]);
  }
}

// Repeated tokens (V smaller than R) must add up; D = 300 spans two column blocks.
TEST(Embedding, EmbeddingBackwardAccumulatesRepeatedTokensDeterministically) {
  uint64_t seed = 20;
  for (const auto& s : kShapes) {
    const int64_t R = s[0], V = s[1], D = s[2];
    auto dout = random_values(R * D, seed++);
    auto tokens = random_tokens(R, V, seed++);
    auto dtable = random_values(V * D, seed++);  // existing gradient: accumulated into
    std::vector<double> want(dtable.begin(), dtable.end());
    for (int64_t r = 0; r < R; ++r)
      for (int64_t d = 0; d < D; ++d) want[tokens[r] * D + d] += dout[r * D + d];
    auto again = dtable;
    moe::embedding_backward(f32_tensor(dtable.data(), {V, D}), f32_tensor(dout.data(), {R, D}),
                            i32_tensor(tokens.data(), {R}));
    moe::embedding_backward(f32_tensor(again.data(), {V, D}), f32_tensor(dout.data(), {R, D}),
                            i32_tensor(tokens.data(), {R}));
    // FP32 sums of at most R O(1) terms.
    for (int64_t i = 0; i < V * D; ++i) ASSERT_NEAR(dtable[i], want[i], 1e-6 * R) << "at " << i;
    EXPECT_EQ(dtable, again);
  }
}

TEST(Embedding, EmbeddingRejectsOutOfRangeToken) {
  std::vector<float> table(4 * 2), out(2 * 2);
  std::vector<int32_t> tokens = {1, 4};
  try {
    moe::embedding_forward(f32_tensor(out.data(), {2, 2}), f32_tensor(table.data(), {4, 2}),
                           i32_tensor(tokens.data(), {2}));
    FAIL() << "expected moe::Error";
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokens[1] = 4"), std::string::npos) << e.what();
  }
}

}  // namespace

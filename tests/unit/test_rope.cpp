// RoPE against a naive double rotate-half loop; backward as the exact inverse and adjoint.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moe/core/rng.h"
#include "moe/ops/rope.h"

namespace {

using moe::f32_tensor;

std::vector<float> random_values(int64_t n, uint64_t seed) {
  moe::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

// Hugging Face rotate_half: out = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1].
std::vector<double> naive_rope(const std::vector<float>& x, int64_t rows, int64_t T, int64_t H, int64_t hd,
                               double theta) {
  std::vector<double> out(x.begin(), x.end());
  const int64_t half = hd / 2;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = double(r % T) * std::pow(theta, -2.0 * double(i) / double(hd));
        const int64_t a = r * H * hd + h * hd + i, b = a + half;
        out[a] = x[a] * std::cos(angle) - x[b] * std::sin(angle);
        out[b] = x[b] * std::cos(angle) + x[a] * std::sin(angle);
      }
  return out;
}

struct RopeCase {
  int64_t B, T, H, hd;
  float theta;
};
const RopeCase kCases[] = {{2, 5, 3, 8, 10000.0f}, {1, 37, 2, 6, 10000.0f}, {3, 1, 1, 2, 10000.0f},
                           {1, 300, 2, 64, 500000.0f}};

// Values are O(1) and cos/sin are rounded to FP32 once: 2e-6 absolute covers the two roundings.
TEST(Rope, RopeForwardMatchesNaiveRotateHalf) {
  uint64_t seed = 1;
  for (const auto& c : kCases) {
    const int64_t rows = c.B * c.T, width = c.H * c.hd;
    auto x = random_values(rows * width, seed++);
    const auto want = naive_rope(x, rows, c.T, c.H, c.hd, c.theta);
    moe::rope_forward(f32_tensor(x.data(), {rows, width}), c.T, c.H, c.theta);
    SCOPED_TRACE(testing::Message() << "B=" << c.B << " T=" << c.T << " H=" << c.H << " hd=" << c.hd);
    for (int64_t i = 0; i < rows * width; ++i) ASSERT_NEAR(x[i], want[i], 2e-6 * (1.0 + std::fabs(want[i])));
  }
}

TEST(Rope, RopeLeavesFirstPositionOfEverySequenceUnchanged) {
  const int64_t B = 3, T = 4, H = 2, hd = 6, width = H * hd;
  auto x = random_values(B * T * width, 5);
  const auto x0 = x;
  moe::rope_forward(f32_tensor(x.data(), {B * T, width}), T, H, 10000.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < width; ++j) EXPECT_EQ(x[b * T * width + j], x0[b * T * width + j]);
  EXPECT_NE(x[width], x0[width]);  // position 1 does rotate
}

// rope_backward is R^T: it undoes rope_forward, and <R x, y> = <x, R^T y> in double.
TEST(Rope, RopeBackwardIsInverseAndAdjointOfForward) {
  uint64_t seed = 50;
  for (const auto& c : kCases) {
    const int64_t rows = c.B * c.T, width = c.H * c.hd, n = rows * width;
    auto x = random_values(n, seed++), y = random_values(n, seed++);
    auto rx = x, rty = y;
    moe::rope_forward(f32_tensor(rx.data(), {rows, width}), c.T, c.H, c.theta);
    moe::rope_backward(f32_tensor(rty.data(), {rows, width}), c.T, c.H, c.theta);
    double lhs = 0.0, rhs = 0.0, norm = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      lhs += double(rx[i]) * y[i];
      rhs += double(x[i]) * rty[i];
      norm += std::fabs(double(x[i]) * y[i]);
    }
    SCOPED_TRACE(testing::Message() << "T=" << c.T << " hd=" << c.hd);
    EXPECT_NEAR(lhs, rhs, 1e-6 * norm);
    auto back = rx;
    moe::rope_backward(f32_tensor(back.data(), {rows, width}), c.T, c.H, c.theta);
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(back[i], x[i], 4e-6 * (1.0 + std::fabs(x[i])));
  }
}

TEST(Rope, RopeRejectsOddHeadDimAndPartialSequences) {
  std::vector<float> x(2 * 6);
  EXPECT_THROW(moe::rope_forward(f32_tensor(x.data(), {2, 6}), 2, 2, 10000.0f), moe::Error);  // hd = 3
  EXPECT_THROW(moe::rope_forward(f32_tensor(x.data(), {2, 6}), 3, 1, 10000.0f), moe::Error);  // 2 rows, T = 3
}

}  // namespace

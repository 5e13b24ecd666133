// SwiGLU against naive double loops and finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "moe/core/rng.h"
#include "moe/ops/activation.h"

namespace {

using moe::f32_tensor;

std::vector<float> random_values(int64_t n, uint64_t seed, double scale = 1.0) {
  moe::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

const int64_t kShapes[][2] = {{1, 1}, {3, 7}, {33, 130}, {8, 64}};

TEST(Activation, SwigluForwardMatchesNaiveWithGateColumnsFirst) {
  uint64_t seed = 1;
  for (const auto& s : kShapes) {
    const int64_t R = s[0], H = s[1];
    auto gu = random_values(R * 2 * H, seed++, 3.0);
    std::vector<float> out(R * H);
    moe::swiglu_forward(f32_tensor(out.data(), {R, H}), f32_tensor(gu.data(), {R, 2 * H}));
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < H; ++j) {
        const double want = silu(gu[r * 2 * H + j]) * gu[r * 2 * H + H + j];
        ASSERT_NEAR(out[r * H + j], want, 1e-6 * (1.0 + std::fabs(want))) << "R=" << R << " H=" << H;
      }
  }
}

TEST(Activation, SwigluBackwardMatchesNaiveDoubleAndOverwrites) {
  uint64_t seed = 10;
  for (const auto& s : kShapes) {
    const int64_t R = s[0], H = s[1];
    auto gu = random_values(R * 2 * H, seed++, 3.0), dy = random_values(R * H, seed++);
    auto dgu = random_values(R * 2 * H, seed++);  // garbage: must be overwritten
    moe::swiglu_backward(f32_tensor(dgu.data(), {R, 2 * H}), f32_tensor(dy.data(), {R, H}),
                         f32_tensor(gu.data(), {R, 2 * H}));
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < H; ++j) {
        const double g = gu[r * 2 * H + j], u = gu[r * 2 * H + H + j], d = dy[r * H + j];
        const double sig = 1.0 / (1.0 + std::exp(-g));
        const double want_dg = d * u * (sig + g * sig * (1.0 - sig)), want_du = d * silu(g);
        ASSERT_NEAR(dgu[r * 2 * H + j], want_dg, 1e-5 * (1.0 + std::fabs(want_dg)));
        ASSERT_NEAR(dgu[r * 2 * H + H + j], want_du, 1e-5 * (1.0 + std::fabs(want_du)));
      }
  }
}

// recompute = experts takes the SwiGLU output from the backward pass: it must be the forward's
// bits (the recomputed step is bit-equal to the kept one) and the gradient swiglu_backward's.
TEST(Activation, SwigluBackwardWithOutputWritesTheForwardBitsAndTheSameGradient) {
  uint64_t seed = 40;
  for (const auto& s : kShapes) {
    const int64_t R = s[0], H = s[1];
    auto gu = random_values(R * 2 * H, seed++, 3.0), dy = random_values(R * H, seed++);
    std::vector<float> out_fwd(R * H), dgu(R * 2 * H), out(R * H, 7.0f), dgu_with(R * 2 * H, 7.0f);
    moe::swiglu_forward(f32_tensor(out_fwd.data(), {R, H}), f32_tensor(gu.data(), {R, 2 * H}));
    moe::swiglu_backward(f32_tensor(dgu.data(), {R, 2 * H}), f32_tensor(dy.data(), {R, H}),
                         f32_tensor(gu.data(), {R, 2 * H}));
    moe::swiglu_backward_with_output(f32_tensor(dgu_with.data(), {R, 2 * H}), f32_tensor(out.data(), {R, H}),
                                     f32_tensor(dy.data(), {R, H}), f32_tensor(gu.data(), {R, 2 * H}));
    EXPECT_EQ(0, std::memcmp(out.data(), out_fwd.data(), out.size() * sizeof(float))) << "R=" << R << " H=" << H;
    EXPECT_EQ(0, std::memcmp(dgu_with.data(), dgu.data(), dgu.size() * sizeof(float))) << "R=" << R << " H=" << H;
  }
}

// L = sum(out * P) in double; step 1e-2, FP32 noise ~1e-5, truncation ~1e-4 against O(1) grads.
TEST(Activation, SwigluBackwardMatchesFiniteDifferences) {
  const int64_t R = 3, H = 5;
  auto gu = random_values(R * 2 * H, 3, 2.0), probe = random_values(R * H, 4);
  auto loss = [&](std::vector<float> in) {
    std::vector<float> out(R * H);
    moe::swiglu_forward(f32_tensor(out.data(), {R, H}), f32_tensor(in.data(), {R, 2 * H}));
    double l = 0.0;
    for (int64_t i = 0; i < R * H; ++i) l += double(out[i]) * probe[i];
    return l;
  };
  std::vector<float> dgu(R * 2 * H);
  moe::swiglu_backward(f32_tensor(dgu.data(), {R, 2 * H}), f32_tensor(probe.data(), {R, H}),
                       f32_tensor(gu.data(), {R, 2 * H}));
  for (int64_t i = 0; i < R * 2 * H; ++i) {
    auto p = gu, m = gu;
    p[i] += 1e-2f;
    m[i] -= 1e-2f;
    const double fd = (loss(p) - loss(m)) / (double(p[i]) - m[i]);
    EXPECT_NEAR(dgu[i], fd, 1e-3 + 1e-2 * std::fabs(fd)) << "at " << i;
  }
}

TEST(Activation, SwigluIsFiniteForLargeGates) {
  std::vector<float> gu = {-200.0f, 200.0f, 1.0f, 1.0f}, out(2), dy = {1.0f, 1.0f}, dgu(4);
  moe::swiglu_forward(f32_tensor(out.data(), {1, 2}), f32_tensor(gu.data(), {1, 4}));
  moe::swiglu_backward(f32_tensor(dgu.data(), {1, 4}), f32_tensor(dy.data(), {1, 2}), f32_tensor(gu.data(), {1, 4}));
  EXPECT_NEAR(out[0], 0.0f, 1e-30f);
  EXPECT_FLOAT_EQ(out[1], 200.0f);
  for (float v : dgu) EXPECT_TRUE(std::isfinite(v));
  EXPECT_FLOAT_EQ(dgu[1], 1.0f);  // d silu / dg -> 1 for large g
}

TEST(Activation, SwigluRejectsWrongWidth) {
  std::vector<float> gu(12), out(6);
  EXPECT_THROW(moe::swiglu_forward(f32_tensor(out.data(), {2, 3}), f32_tensor(gu.data(), {2, 5})), moe::Error);
}

}  // namespace

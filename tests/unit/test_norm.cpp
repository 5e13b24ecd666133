// RMSNorm forward/backward against naive double loops and finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moe/core/rng.h"
#include "moe/ops/norm.h"

namespace {

using moe::f32_tensor;

std::vector<float> random_values(int64_t n, uint64_t seed, double scale = 1.0, double offset = 0.0) {
  moe::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(offset + scale * rng.normal());
  return v;
}

struct NaiveNorm {
  std::vector<double> out, rstd, dx, dweight;
};

// Forward and backward in double, the backward written as the plain chain rule.
NaiveNorm naive_rmsnorm(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& g,
                        int64_t R, int64_t C, double eps) {
  NaiveNorm n{std::vector<double>(R * C), std::vector<double>(R), std::vector<double>(R * C),
              std::vector<double>(C, 0.0)};
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += double(x[r * C + c]) * x[r * C + c];
    const double rs = 1.0 / std::sqrt(ss / C + eps);
    n.rstd[r] = rs;
    double sum_wgx = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      n.out[r * C + c] = x[r * C + c] * rs * w[c];
      sum_wgx += double(w[c]) * g[r * C + c] * x[r * C + c];
      n.dweight[c] += double(g[r * C + c]) * x[r * C + c] * rs;
    }
    // d out_c / d x_j = w_c (rs delta_cj - x_c rs^3 x_j / C)
    for (int64_t j = 0; j < C; ++j)
      n.dx[r * C + j] = rs * w[j] * g[r * C + j] - x[r * C + j] * rs * rs * rs * sum_wgx / C;
  }
  return n;
}

const int64_t kShapes[][2] = {{1, 1}, {3, 7}, {17, 130}, {5, 256}, {64, 33}};

TEST(Norm, RmsnormForwardMatchesNaive) {
  uint64_t seed = 1;
  for (const auto& s : kShapes) {
    const int64_t R = s[0], C = s[1];
    auto x = random_values(R * C, seed++), w = random_values(C, seed++, 0.5, 1.0);
    std::vector<float> out(R * C), rstd(R), g(R * C, 0.0f);
    moe::rmsnorm_forward(f32_tensor(out.data(), {R, C}), f32_tensor(rstd.data(), {R}), f32_tensor(x.data(), {R, C}),
                         f32_tensor(w.data(), {C}), 1e-5f);
    const auto want = naive_rmsnorm(x, w, g, R, C, 1e-5);
    SCOPED_TRACE(testing::Message() << "R=" << R << " C=" << C);
    for (int64_t r = 0; r < R; ++r) ASSERT_NEAR(rstd[r], want.rstd[r], 1e-5 * want.rstd[r]);
    for (int64_t i = 0; i < R * C; ++i) ASSERT_NEAR(out[i], want.out[i], 1e-5 * (1.0 + std::fabs(want.out[i])));
  }
}

TEST(Norm, RmsnormBackwardMatchesNaiveDoubleAndAccumulates) {
  uint64_t seed = 100;
  for (const auto& s : kShapes) {
    const int64_t R = s[0], C = s[1];
    auto x = random_values(R * C, seed++), w = random_values(C, seed++, 0.5, 1.0), g = random_values(R * C, seed++);
    std::vector<float> out(R * C), rstd(R);
    moe::rmsnorm_forward(f32_tensor(out.data(), {R, C}), f32_tensor(rstd.data(), {R}), f32_tensor(x.data(), {R, C}),
                         f32_tensor(w.data(), {C}), 1e-5f);
    const auto want = naive_rmsnorm(x, w, g, R, C, 1e-5);
    for (int accumulate = 0; accumulate < 2; ++accumulate) {
      auto dx = random_values(R * C, seed++);  // garbage when overwritten, a residual grad when accumulated
      auto dw = random_values(C, seed++);      // dweight always accumulates
      const auto dx0 = dx, dw0 = dw;
      moe::rmsnorm_backward(f32_tensor(dx.data(), {R, C}), f32_tensor(dw.data(), {C}), f32_tensor(g.data(), {R, C}),
                            f32_tensor(x.data(), {R, C}), f32_tensor(w.data(), {C}), f32_tensor(rstd.data(), {R}),
                            accumulate == 1);
      SCOPED_TRACE(testing::Message() << "R=" << R << " C=" << C << " accumulate=" << accumulate);
      // Tolerance: FP32 rounding of O(1) terms, relative 1e-5 plus 1e-5 absolute.
      for (int64_t i = 0; i < R * C; ++i) {
        const double expect = want.dx[i] + (accumulate ? dx0[i] : 0.0);
        ASSERT_NEAR(dx[i], expect, 1e-5 * (1.0 + std::fabs(expect))) << "dx at " << i;
      }
      for (int64_t c = 0; c < C; ++c) {
        const double expect = dw0[c] + want.dweight[c];
        ASSERT_NEAR(dw[c], expect, 1e-5 * (1.0 + std::fabs(expect)) * std::sqrt(double(R))) << "dweight at " << c;
      }
    }
  }
}

// L = sum(out * P) in double with a random P; central differences with step 1e-2 have
// truncation error O(1e-4) and FP32 noise about 1e-5 / 1e-2 here, against gradients of O(1).
TEST(Norm, RmsnormBackwardMatchesFiniteDifferences) {
  const int64_t R = 4, C = 9;
  auto x = random_values(R * C, 7), w = random_values(C, 8, 0.5, 1.0), probe = random_values(R * C, 9);
  auto loss = [&](const std::vector<float>& xv, const std::vector<float>& wv) {
    std::vector<float> out(R * C), rstd(R);
    moe::rmsnorm_forward(f32_tensor(out.data(), {R, C}), f32_tensor(rstd.data(), {R}),
                         f32_tensor(const_cast<float*>(xv.data()), {R, C}),
                         f32_tensor(const_cast<float*>(wv.data()), {C}), 1e-5f);
    double l = 0.0;
    for (int64_t i = 0; i < R * C; ++i) l += double(out[i]) * probe[i];
    return l;
  };
  std::vector<float> out(R * C), rstd(R), dx(R * C), dw(C, 0.0f);
  moe::rmsnorm_forward(f32_tensor(out.data(), {R, C}), f32_tensor(rstd.data(), {R}), f32_tensor(x.data(), {R, C}),
                       f32_tensor(w.data(), {C}), 1e-5f);
  moe::rmsnorm_backward(f32_tensor(dx.data(), {R, C}), f32_tensor(dw.data(), {C}), f32_tensor(probe.data(), {R, C}),
                        f32_tensor(x.data(), {R, C}), f32_tensor(w.data(), {C}), f32_tensor(rstd.data(), {R}), false);
  const float step = 1e-2f;
  for (int64_t i = 0; i < R * C; ++i) {
    auto xp = x, xm = x;
    xp[i] += step;
    xm[i] -= step;
    const double fd = (loss(xp, w) - loss(xm, w)) / (double(xp[i]) - xm[i]);
    EXPECT_NEAR(dx[i], fd, 2e-3 + 1e-2 * std::fabs(fd)) << "dx at " << i;
  }
  for (int64_t c = 0; c < C; ++c) {
    auto wp = w, wm = w;
    wp[c] += step;
    wm[c] -= step;
    const double fd = (loss(x, wp) - loss(x, wm)) / (double(wp[c]) - wm[c]);
    EXPECT_NEAR(dw[c], fd, 2e-3 + 1e-2 * std::fabs(fd)) << "dweight at " << c;
  }
}

TEST(Norm, RmsnormRejectsMismatchedShapes) {
  std::vector<float> x(12), out(12), rstd(3), w(5);
  EXPECT_THROW(moe::rmsnorm_forward(f32_tensor(out.data(), {3, 4}), f32_tensor(rstd.data(), {3}),
                                    f32_tensor(x.data(), {3, 4}), f32_tensor(w.data(), {5}), 1e-5f),
               moe::Error);
}

}  // namespace

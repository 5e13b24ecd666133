// matmul against a naive double-precision product, for every transpose combination, odd
// shapes, folded leading dims and zero-size dimensions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "moe/core/rng.h"
#include "moe/ops/gemm.h"

namespace {

using moe::f32_tensor;

std::vector<float> random_values(int64_t n, uint64_t seed) {
  moe::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

// c = alpha * op(a) op(b) + beta * c in double, from the row-major storage.
std::vector<double> naive_matmul(const std::vector<float>& a, const std::vector<float>& b,
                                 const std::vector<float>& c, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                                 double alpha, double beta) {
  std::vector<double> out(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double av = ta ? a[k * M + m] : a[m * K + k];
        const double bv = tb ? b[n * K + k] : b[k * N + n];
        acc += av * bv;
      }
      out[m * N + n] = alpha * acc + beta * c[m * N + n];
    }
  return out;
}

// FP32 accumulation over K terms of unit-variance products: error grows about like sqrt(K) * eps;
// 1e-5 * (1 + K) absolute is a loose bound that still catches any wrong index or transpose.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, int64_t K) {
  ASSERT_EQ(got.size(), want.size());
  const double tol = 1e-5 * (1.0 + static_cast<double>(K));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol + 1e-5 * std::fabs(want[i])) << "at element " << i;
}

TEST(Gemm, MatmulMatchesNaiveForAllTransposesAndOddShapes) {
  const int64_t shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {64, 128, 31}, {3, 100, 2}};
  uint64_t seed = 1;
  for (const auto& s : shapes) {
    const int64_t M = s[0], N = s[1], K = s[2];
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        auto a = random_values(M * K, seed++);
        auto b = random_values(K * N, seed++);
        auto c = random_values(M * N, seed++);
        const auto want = naive_matmul(a, b, c, M, N, K, ta, tb, 0.7, 0.3);
        moe::matmul(f32_tensor(c.data(), {M, N}), f32_tensor(a.data(), ta ? moe::Shape{K, M} : moe::Shape{M, K}),
                    f32_tensor(b.data(), tb ? moe::Shape{N, K} : moe::Shape{K, N}), ta, tb, 0.7f, 0.3f);
        SCOPED_TRACE(testing::Message() << "M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb);
        expect_close(c, want, K);
      }
  }
}

TEST(Gemm, LinearLayerConventionComputesXTimesWTransposed) {
  const int64_t rows = 9, in = 13, out = 6;
  auto x = random_values(rows * in, 11), w = random_values(out * in, 12);
  std::vector<float> y(rows * out, std::numeric_limits<float>::quiet_NaN());  // beta = 0 must ignore y
  moe::matmul(f32_tensor(y.data(), {rows, out}), f32_tensor(x.data(), {rows, in}), f32_tensor(w.data(), {out, in}),
              false, true, 1.0f, 0.0f);
  std::vector<float> zeros(rows * out, 0.0f);
  expect_close(y, naive_matmul(x, w, zeros, rows, out, in, false, true, 1.0, 0.0), in);
}

TEST(Gemm, MatmulFoldsLeadingDimsIntoRows) {
  const int64_t B = 2, T = 5, K = 7, N = 4;
  auto a = random_values(B * T * K, 21), b = random_values(K * N, 22);
  std::vector<float> c(B * T * N, 0.0f);
  moe::matmul(f32_tensor(c.data(), {B, T, N}), f32_tensor(a.data(), {B, T, K}), f32_tensor(b.data(), {K, N}), false,
              false, 1.0f, 0.0f);
  expect_close(c, naive_matmul(a, b, std::vector<float>(c.size(), 0.0f), B * T, N, K, false, false, 1.0, 0.0), K);
}

TEST(Gemm, MatmulWithZeroInnerDimScalesC) {
  const int64_t M = 3, N = 4;
  std::vector<float> a(1), b(1);
  auto c = random_values(M * N, 31);
  const auto c0 = c;
  moe::matmul(f32_tensor(c.data(), {M, N}), f32_tensor(a.data(), {M, 0}), f32_tensor(b.data(), {0, N}), false, false,
              1.0f, 0.5f);
  for (size_t i = 0; i < c.size(); ++i) EXPECT_FLOAT_EQ(c[i], 0.5f * c0[i]);
  std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
  moe::matmul(f32_tensor(c.data(), {M, N}), f32_tensor(a.data(), {0, M}), f32_tensor(b.data(), {N, 0}), true, true,
              1.0f, 0.0f);
  for (float v : c) EXPECT_EQ(v, 0.0f);
}

TEST(Gemm, MatmulWithZeroRowsOrColumnsDoesNothing) {
  std::vector<float> a(8, 1.0f), b(8, 1.0f), c(8, 5.0f);
  moe::matmul(f32_tensor(c.data(), {0, 4}), f32_tensor(a.data(), {0, 2}), f32_tensor(b.data(), {2, 4}), false, false,
              1.0f, 0.0f);
  moe::matmul(f32_tensor(c.data(), {4, 0}), f32_tensor(a.data(), {4, 2}), f32_tensor(b.data(), {2, 0}), false, false,
              1.0f, 0.0f);
  for (float v : c) EXPECT_EQ(v, 5.0f);
}

TEST(Gemm, MatmulRejectsMismatchedShapesAndDtypes) {
  std::vector<float> a(12), b(12), c(12);
  EXPECT_THROW(moe::matmul(f32_tensor(c.data(), {3, 4}), f32_tensor(a.data(), {3, 3}), f32_tensor(b.data(), {4, 4}),
                           false, false, 1.0f, 0.0f),
               moe::Error);
  moe::Tensor ib(b.data(), moe::DType::I32, {3, 4});
  EXPECT_THROW(moe::matmul(f32_tensor(c.data(), {3, 4}), f32_tensor(a.data(), {3, 3}), ib, false, false, 1.0f, 0.0f),
               moe::Error);
}

}  // namespace

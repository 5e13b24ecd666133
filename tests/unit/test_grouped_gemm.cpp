// Grouped expert GEMMs against naive double loops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "moe/core/rng.h"
#include "moe/ops/grouped_gemm.h"

namespace moe {
namespace {

constexpr float kSentinel = -12345.0f;

std::vector<float> random_vec(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.uniform() * 2 - 1);
  return v;
}

std::vector<int32_t> offsets_of(const std::vector<int>& counts) {
  std::vector<int32_t> o(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) o[e + 1] = o[e] + counts[e];
  return o;
}

struct Case {
  std::vector<int> counts;  // rows per expert (zeros included)
  int k_in, n_out;
  int spare_rows;  // buffer rows past offsets[E]
};
// Zero-row experts at the front, middle and end; one case with every expert empty.
const Case kCases[] = {
    {{3}, 5, 4, 0},
    {{0, 4, 0, 7, 0}, 16, 8, 3},
    {{10, 1, 0, 25}, 33, 17, 5},
    {{64, 0, 40, 128, 1, 0, 0, 9}, 64, 96, 16},
    {{0, 0, 0}, 8, 8, 4},
};

// c = (c +) a_e * op(b_e) per expert, within 1e-5 * sum|terms| + 1e-6 of double. Rows past
// offsets[E] keep their bits; with accumulate off, stale NaNs in c are overwritten.
TEST(GroupedGemm, matmul_matches_naive_double) {
  uint64_t seed = 1;
  for (const auto& cs : kCases)
    for (bool trans_b : {false, true})
      for (bool accumulate : {false, true}) {
        const int E = static_cast<int>(cs.counts.size()), K = cs.k_in, N = cs.n_out;
        auto offsets = offsets_of(cs.counts);
        const int used = offsets[E], rows = used + cs.spare_rows;
        SCOPED_TRACE(testing::Message() << "E=" << E << " rows=" << used << " K=" << K << " N=" << N
                                        << " trans_b=" << trans_b << " acc=" << accumulate);
        auto a = random_vec(size_t(rows) * K, ++seed);
        auto b = random_vec(size_t(E) * K * N, ++seed);
        auto c = random_vec(size_t(rows) * N, ++seed);
        if (!accumulate)
          for (int i = 0; i < used * N; ++i) c[i] = std::numeric_limits<float>::quiet_NaN();
        for (int i = used * N; i < rows * N; ++i) c[i] = kSentinel;
        const auto before = c;
        const Tensor bt = trans_b ? f32_tensor(b.data(), {E, N, K}) : f32_tensor(b.data(), {E, K, N});
        grouped_matmul(f32_tensor(c.data(), {rows, N}), f32_tensor(a.data(), {rows, K}), bt,
                       i32_tensor(offsets.data(), {E + 1}), trans_b, accumulate);
        for (int e = 0; e < E; ++e)
          for (int r = offsets[e]; r < offsets[e + 1]; ++r)
            for (int n = 0; n < N; ++n) {
              double want = accumulate ? before[r * N + n] : 0.0, mag = std::abs(want);
              for (int k = 0; k < K; ++k) {
                const double bv = trans_b ? b[(size_t(e) * N + n) * K + k] : b[(size_t(e) * K + k) * N + n];
                want += a[r * K + k] * bv;
                mag += std::abs(a[r * K + k] * bv);
              }
              ASSERT_NEAR(c[r * N + n], want, 1e-5 * mag + 1e-6) << "e=" << e << " r=" << r << " n=" << n;
            }
        ASSERT_EQ(std::memcmp(c.data() + used * N, before.data() + used * N, size_t(rows - used) * N * 4), 0)
            << "rows past offsets[E] were written";
      }
}

// db[e] += dc_e^T a_e within 1e-5 * sum|terms| + 1e-6 of double; experts with zero rows keep
// their db bit for bit; rows past offsets[E] (filled with NaN) are never read.
TEST(GroupedGemm, wgrad_matches_naive_double) {
  uint64_t seed = 100;
  for (const auto& cs : kCases) {
    const int E = static_cast<int>(cs.counts.size()), K = cs.k_in, N = cs.n_out;
    auto offsets = offsets_of(cs.counts);
    const int used = offsets[E], rows = used + cs.spare_rows;
    SCOPED_TRACE(testing::Message() << "E=" << E << " rows=" << used << " K=" << K << " N=" << N);
    auto a = random_vec(size_t(rows) * K, ++seed);
    auto dc = random_vec(size_t(rows) * N, ++seed);
    for (int i = used * K; i < rows * K; ++i) a[i] = std::numeric_limits<float>::quiet_NaN();
    for (int i = used * N; i < rows * N; ++i) dc[i] = std::numeric_limits<float>::quiet_NaN();
    auto db = random_vec(size_t(E) * N * K, ++seed);
    const auto before = db;
    grouped_matmul_wgrad(f32_tensor(db.data(), {E, N, K}), f32_tensor(dc.data(), {rows, N}),
                         f32_tensor(a.data(), {rows, K}), i32_tensor(offsets.data(), {E + 1}));
    for (int e = 0; e < E; ++e) {
      const size_t base = size_t(e) * N * K;
      if (cs.counts[e] == 0) {
        ASSERT_EQ(std::memcmp(db.data() + base, before.data() + base, size_t(N) * K * 4), 0) << "expert " << e;
        continue;
      }
      for (int n = 0; n < N; ++n)
        for (int k = 0; k < K; ++k) {
          double want = before[base + n * K + k], mag = std::abs(want);
          for (int r = offsets[e]; r < offsets[e + 1]; ++r) {
            want += double(dc[r * N + n]) * a[r * K + k];
            mag += std::abs(double(dc[r * N + n]) * a[r * K + k]);
          }
          ASSERT_NEAR(db[base + n * K + k], want, 1e-5 * mag + 1e-6) << "e=" << e << " n=" << n << " k=" << k;
        }
    }
  }
}

// accumulate = false writes db (every element, experts without rows become zero): the same bits
// as accumulating into zeros.
TEST(GroupedGemm, wgrad_overwrite_equals_accumulating_into_zeros) {
  const std::vector<int> counts = {3, 0, 5, 0, 1};
  const int E = static_cast<int>(counts.size()), K = 6, N = 4;
  auto offsets = offsets_of(counts);
  const int rows = offsets[E];
  auto a = random_vec(size_t(rows) * K, 7), dc = random_vec(size_t(rows) * N, 8);
  std::vector<float> zeros(size_t(E) * N * K, 0.0f), written(size_t(E) * N * K, std::numeric_limits<float>::quiet_NaN());
  auto call = [&](std::vector<float>& db, bool accumulate) {
    grouped_matmul_wgrad(f32_tensor(db.data(), {E, N, K}), f32_tensor(dc.data(), {rows, N}),
                         f32_tensor(a.data(), {rows, K}), i32_tensor(offsets.data(), {E + 1}), {}, accumulate);
  };
  call(zeros, true);
  call(written, false);
  ASSERT_EQ(std::memcmp(zeros.data(), written.data(), zeros.size() * sizeof(float)), 0);
}

TEST(GroupedGemm, rejects_bad_offsets_and_shapes) {
  std::vector<float> a(6 * 4), b(2 * 4 * 3), c(6 * 3);
  std::vector<int32_t> offsets = {0, 4, 2};  // decreasing
  auto call = [&](Tensor bt) {
    grouped_matmul(f32_tensor(c.data(), {6, 3}), f32_tensor(a.data(), {6, 4}), bt, i32_tensor(offsets.data(), {3}),
                   false, false);
  };
  EXPECT_THROW(call(f32_tensor(b.data(), {2, 4, 3})), Error);
  offsets = {0, 4, 7};  // past the 6 rows
  EXPECT_THROW(call(f32_tensor(b.data(), {2, 4, 3})), Error);
  offsets = {0, 4, 6};
  EXPECT_NO_THROW(call(f32_tensor(b.data(), {2, 4, 3})));
  EXPECT_THROW(call(f32_tensor(b.data(), {2, 3, 4})), Error);  // inner dimension mismatch
}

}  // namespace
}  // namespace moe

// Routing metadata against naive loops; all results are integers and must match exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "moe/core/rng.h"
#include "moe/ops/route.h"

namespace moe {
namespace {

std::vector<int32_t> random_topk(int T, int N, int K, uint64_t seed, int skip_expert = -1) {
  Rng rng(seed);
  std::vector<int32_t> idx(static_cast<size_t>(T) * K);
  std::vector<int32_t> experts;
  for (int e = 0; e < N; ++e)
    if (e != skip_expert) experts.push_back(e);
  for (int t = 0; t < T; ++t) {
    // K distinct experts, in random order (as top-K produces distinct ids).
    auto pool = experts;
    for (int k = 0; k < K; ++k) {
      const size_t j = k + rng.below(pool.size() - k);
      std::swap(pool[k], pool[j]);
      idx[t * K + k] = pool[k];
    }
  }
  return idx;
}

std::vector<int32_t> counts_of(const std::vector<int32_t>& idx, int N) {
  std::vector<int32_t> counts(N, 0);
  std::vector<int32_t> topk = idx;
  route_counts(i32_tensor(counts.data(), {N}), i32_tensor(topk.data(), {static_cast<int64_t>(idx.size()), 1}));
  return counts;
}

struct Placement {
  std::vector<int32_t> route_index, offsets;
};

// Naive placement: list routes expert-major, then token, then k; the first rank_capacity rows
// are kept at their list position, the rest are dropped.
Placement ref_place(const std::vector<int32_t>& idx, int T, int N, int K, int64_t capacity) {
  Placement p{std::vector<int32_t>(static_cast<size_t>(T) * K, -1), std::vector<int32_t>(N + 1, 0)};
  int64_t row = 0;
  for (int e = 0; e < N; ++e) {
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k)
        if (idx[t * K + k] == e) {
          if (row < capacity) p.route_index[t * K + k] = static_cast<int32_t>(row);
          ++row;
        }
    p.offsets[e + 1] = static_cast<int32_t>(std::min<int64_t>(row, capacity));
  }
  return p;
}

Placement place(std::vector<int32_t> idx, int T, int N, int K, int64_t capacity) {
  auto counts = counts_of(idx, N);
  Placement p{std::vector<int32_t>(static_cast<size_t>(T) * K, -7), std::vector<int32_t>(N + 1, -7)};
  route_index_local(i32_tensor(p.route_index.data(), {T * K}), i32_tensor(p.offsets.data(), {N + 1}),
                    i32_tensor(idx.data(), {T, K}), i32_tensor(counts.data(), {N}), capacity);
  return p;
}

// Counts equal a naive histogram, including an expert that receives zero tokens.
TEST(Route, counts_match_naive_histogram) {
  const int shapes[][3] = {{1, 4, 1}, {10, 8, 2}, {100, 16, 4}, {37, 5, 5}};
  uint64_t seed = 1;
  for (const auto& s : shapes) {
    const int T = s[0], N = s[1], K = s[2];
    const int skip = K < N ? N / 2 : -1;
    const auto idx = random_topk(T, N, K, ++seed, skip);
    std::vector<int32_t> counts(N, 99), topk = idx;
    route_counts(i32_tensor(counts.data(), {N}), i32_tensor(topk.data(), {T, K}));
    std::vector<int32_t> expected(N, 0);
    for (int32_t e : idx) ++expected[e];
    EXPECT_EQ(counts, expected) << "T=" << T << " N=" << N << " K=" << K;
    if (skip >= 0) {
      EXPECT_EQ(counts[skip], 0);
    }
  }
}

// A hand-checked example where capacity 4 keeps expert 0 whole, cuts expert 1 after one row and
// drops expert 2 entirely.
TEST(Route, tail_drop_keeps_expert_major_token_k_prefix) {
  const int T = 4, N = 3, K = 2;
  // t0 -> {0, 1}, t1 -> {1, 0}, t2 -> {0, 2}, t3 -> {1, 2}
  const std::vector<int32_t> idx = {0, 1, 1, 0, 0, 2, 1, 2};
  // Expert-major order: e0: (t0,k0) (t1,k1) (t2,k0); e1: (t0,k1) (t1,k0) (t3,k0); e2: (t2,k1) (t3,k1).
  const auto p = place(idx, T, N, K, 4);
  EXPECT_EQ(p.route_index, (std::vector<int32_t>{0, 3, -1, 1, 2, -1, -1, -1}));
  EXPECT_EQ(p.offsets, (std::vector<int32_t>{0, 3, 4, 4}));

  const auto full = place(idx, T, N, K, 8);
  EXPECT_EQ(full.route_index, (std::vector<int32_t>{0, 3, 4, 1, 2, 6, 5, 7}));
  EXPECT_EQ(full.offsets, (std::vector<int32_t>{0, 3, 6, 8}));

  const auto none = place(idx, T, N, K, 0);
  EXPECT_EQ(none.route_index, std::vector<int32_t>(T * K, -1));
  EXPECT_EQ(none.offsets, (std::vector<int32_t>{0, 0, 0, 0}));
}

// Random routings at capacities from zero to beyond T*K: exact equality with the naive
// placement, kept rows numbered 0..kept-1 with no repeats, each inside its expert's range.
TEST(Route, index_matches_naive_with_and_without_drops) {
  const int shapes[][3] = {{1, 4, 1}, {10, 8, 2}, {100, 16, 4}, {37, 5, 5}, {3000, 64, 8}};
  uint64_t seed = 10;
  for (const auto& s : shapes) {
    const int T = s[0], N = s[1], K = s[2];
    const auto idx = random_topk(T, N, K, ++seed, K < N ? 0 : -1);
    const int64_t TK = int64_t(T) * K;
    for (int64_t capacity : {int64_t(0), int64_t(1), TK / 3, (TK * 4) / 5, TK - 1, TK, TK * 5 / 4}) {
      SCOPED_TRACE(testing::Message() << "T=" << T << " N=" << N << " K=" << K << " capacity=" << capacity);
      const auto got = place(idx, T, N, K, capacity);
      const auto want = ref_place(idx, T, N, K, capacity);
      ASSERT_EQ(got.offsets, want.offsets);
      ASSERT_EQ(got.route_index, want.route_index);
      const int64_t kept = std::min(capacity, TK);
      ASSERT_EQ(got.offsets[N], kept);
      std::vector<int> seen(kept, 0);
      for (int64_t i = 0; i < TK; ++i) {
        const int32_t r = got.route_index[i];
        if (r < 0) continue;
        ASSERT_LT(r, kept);
        ++seen[r];
        const int32_t e = idx[i];
        ASSERT_GE(r, got.offsets[e]);
        ASSERT_LT(r, got.offsets[e + 1]);
      }
      for (int64_t r = 0; r < kept; ++r) ASSERT_EQ(seen[r], 1) << "row " << r;
    }
  }
}

TEST(Route, rejects_inconsistent_inputs) {
  std::vector<int32_t> idx = {0, 1, 2, 3}, counts = {1, 1, 1, 1}, ri(4), off(5);
  auto call = [&](int64_t capacity) {
    route_index_local(i32_tensor(ri.data(), {4}), i32_tensor(off.data(), {5}), i32_tensor(idx.data(), {2, 2}),
                      i32_tensor(counts.data(), {4}), capacity);
  };
  EXPECT_NO_THROW(call(4));
  EXPECT_THROW(call(-1), Error);
  counts = {2, 0, 1, 1};  // not the counts of idx
  EXPECT_THROW(call(4), Error);
  counts = {1, 1, 1, 1};
  idx[3] = 4;  // not an expert
  EXPECT_THROW(call(4), Error);
}

// load += counts over several microbatches equals the sum of their histograms (exact: counts are
// small integers), and the load is only added to, never reset.
TEST(Route, accumulate_counts_sums_microbatch_counts) {
  const int T = 64, N = 16, K = 4;
  std::vector<float> load(N, 0.5f);
  std::vector<double> want(N, 0.5);
  for (uint64_t microbatch = 0; microbatch < 3; ++microbatch) {
    const auto counts_v = counts_of(random_topk(T, N, K, 100 + microbatch, 3), N);
    std::vector<int32_t> counts = counts_v;
    accumulate_counts(f32_tensor(load.data(), {N}), i32_tensor(counts.data(), {N}));
    for (int e = 0; e < N; ++e) want[e] += counts_v[e];
    EXPECT_EQ(counts, counts_v) << "counts was modified";
  }
  for (int e = 0; e < N; ++e) EXPECT_EQ(load[e], static_cast<float>(want[e])) << "expert " << e;
  EXPECT_EQ(load[3], 0.5f) << "expert 3 gets no route";
}

TEST(Route, accumulate_counts_rejects_mismatched_inputs) {
  std::vector<float> load(4);
  std::vector<int32_t> counts(4);
  EXPECT_NO_THROW(accumulate_counts(f32_tensor(load.data(), {4}), i32_tensor(counts.data(), {4})));
  EXPECT_THROW(accumulate_counts(f32_tensor(load.data(), {4}), i32_tensor(counts.data(), {3})), Error);
  EXPECT_THROW(accumulate_counts(f32_tensor(load.data(), {2, 2}), i32_tensor(counts.data(), {2, 2})), Error);
  EXPECT_THROW(accumulate_counts(i32_tensor(counts.data(), {4}), i32_tensor(counts.data(), {4})), Error);
  EXPECT_THROW(accumulate_counts(f32_tensor(load.data(), {4}), f32_tensor(load.data(), {4})), Error);
}

}  // namespace
}  // namespace moe

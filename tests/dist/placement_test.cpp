// ranks: 1
// The expert-parallel placement (DESIGN.md section 6, steps 3-4) as pure logic: hand-computed
// keep matrices with drops, random counts against a naive simulation of the rule, and dropless
// capacity never dropping. Runs on one rank (no communication involved).
#include "moe/parallel/placement.h"

#include "moe/core/error.h"
#include "moe/parallel/expert_buffers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace moe {
namespace {

using Routes = std::vector<std::vector<int32_t>>;  // [rank][t*K + k]

// The rule, spelled out: at each destination d, walk its local experts, then source ranks, then
// that source's routes in (t, k) order; the n-th row is kept (at row n) while n < rows.
Routes naive_route_index(const Routes& topk, int P, int64_t N, int64_t rows) {
  const int64_t E = N / P;
  Routes index(topk.size());
  for (size_t s = 0; s < topk.size(); ++s) index[s].assign(topk[s].size(), -2);
  for (int d = 0; d < P; ++d) {
    int64_t n = 0;
    for (int64_t e = 0; e < E; ++e)
      for (int s = 0; s < P; ++s)
        for (size_t i = 0; i < topk[s].size(); ++i)
          if (topk[s][i] == d * E + e) {
            index[s][i] = n < rows ? static_cast<int32_t>(d * rows + n) : -1;
            ++n;
          }
  }
  return index;
}

std::vector<int32_t> counts_of(const Routes& topk, int64_t N) {
  std::vector<int32_t> counts(topk.size() * N, 0);
  for (size_t s = 0; s < topk.size(); ++s)
    for (int32_t e : topk[s]) ++counts[s * N + e];
  return counts;
}

Routes assign_all(const Routes& topk, Placement& pl, const std::vector<int32_t>& counts, int64_t T, int64_t K,
                  int64_t N) {
  Routes index(topk.size());
  for (size_t s = 0; s < topk.size(); ++s) {
    index[s].assign(T * K, -2);
    assign_routes(index[s].data(), topk[s].data(), T, K, pl, counts.data() + s * N, static_cast<int>(s));
  }
  return index;
}

TEST(Placement, hand_computed_keep_matrix_with_tail_drop) {
  // P = 2 ranks, N = 4 experts (E = 2 each), T = 4 tokens, K = 2, rows = 5 per destination.
  const int P = 2;
  const int64_t N = 4, T = 4, K = 2, rows = 5;
  const Routes topk = {{0, 2, 0, 3, 0, 1, 2, 3},   // rank 0: counts 3 1 2 2
                       {3, 0, 1, 3, 0, 3, 1, 3}};  // rank 1: counts 2 2 0 4
  const std::vector<int32_t> counts = counts_of(topk, N);
  ASSERT_EQ(counts, (std::vector<int32_t>{3, 1, 2, 2, 2, 2, 0, 4}));
  Placement pl;
  compute_placement(pl, counts.data(), P, N, rows);
  // Destination 0 (experts 0, 1): blocks (e0,s0)=3 (e0,s1)=2 (e1,s0)=1 (e1,s1)=2 -> cumulative 3 5 | 6 8, clamp 5.
  EXPECT_EQ(pl.start_of(0, 0, 0), 0);
  EXPECT_EQ(pl.kept_of(0, 0, 0), 3);
  EXPECT_EQ(pl.start_of(0, 0, 1), 3);
  EXPECT_EQ(pl.kept_of(0, 0, 1), 2);
  EXPECT_EQ(pl.start_of(0, 1, 0), 5);
  EXPECT_EQ(pl.kept_of(0, 1, 0), 0);
  EXPECT_EQ(pl.start_of(0, 1, 1), 5);
  EXPECT_EQ(pl.kept_of(0, 1, 1), 0);
  // Destination 1 (experts 2, 3): (e0,s0)=2 (e0,s1)=0 (e1,s0)=2 (e1,s1)=4 -> cumulative 2 2 | 4 8, clamp 5.
  EXPECT_EQ(pl.start_of(1, 0, 0), 0);
  EXPECT_EQ(pl.kept_of(1, 0, 0), 2);
  EXPECT_EQ(pl.start_of(1, 0, 1), 2);
  EXPECT_EQ(pl.kept_of(1, 0, 1), 0);
  EXPECT_EQ(pl.start_of(1, 1, 0), 2);
  EXPECT_EQ(pl.kept_of(1, 1, 0), 2);
  EXPECT_EQ(pl.start_of(1, 1, 1), 4);
  EXPECT_EQ(pl.kept_of(1, 1, 1), 1);
  EXPECT_EQ(std::vector<int32_t>(pl.offsets_of(0), pl.offsets_of(0) + 3), (std::vector<int32_t>{0, 5, 5}));
  EXPECT_EQ(std::vector<int32_t>(pl.offsets_of(1), pl.offsets_of(1) + 3), (std::vector<int32_t>{0, 2, 5}));
  EXPECT_EQ(pl.kept_from(0, 0), 3);
  EXPECT_EQ(pl.kept_from(0, 1), 2);
  EXPECT_EQ(pl.kept_from(1, 0), 4);
  EXPECT_EQ(pl.kept_from(1, 1), 1);

  const Routes index = assign_all(topk, pl, counts, T, K, N);
  // route value = dst_rank * rows + dst_row.
  EXPECT_EQ(index[0], (std::vector<int32_t>{0, 5, 1, 7, 2, -1, 6, 8}));
  EXPECT_EQ(index[1], (std::vector<int32_t>{9, 3, -1, -1, 4, -1, -1, -1}));
  EXPECT_EQ(index, naive_route_index(topk, P, N, rows));
}

TEST(Placement, random_counts_match_naive_simulation) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    const int P = 1 + static_cast<int>(rng() % 4);
    const int64_t E = 1 + rng() % 3, N = E * P, T = 1 + rng() % 12, K = 1 + rng() % std::min<int64_t>(N, 3);
    const double cf = 0.1 + (rng() % 30) / 10.0;
    const bool dropless = rng() % 5 == 0;
    Routes topk(P);
    for (auto& routes : topk) {
      const bool skewed = rng() % 2 == 0;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> experts(N);
        std::iota(experts.begin(), experts.end(), 0);
        std::shuffle(experts.begin(), experts.end(), rng);
        if (skewed) std::swap(experts[0], *std::find(experts.begin(), experts.end(), 0));
        routes.insert(routes.end(), experts.begin(), experts.begin() + K);
      }
    }
    const int64_t rows = rank_capacity(T, K, P, cf, dropless);
    const std::vector<int32_t> counts = counts_of(topk, N);
    Placement pl;
    compute_placement(pl, counts.data(), P, N, rows);
    const Routes index = assign_all(topk, pl, counts, T, K, N);
    const Routes expected = naive_route_index(topk, P, N, rows);
    ASSERT_EQ(index, expected) << "trial " << trial << " P=" << P << " N=" << N << " T=" << T << " K=" << K
                               << " rows=" << rows;
    // Offsets agree with the rows actually kept at each destination.
    std::vector<int64_t> kept(P, 0);
    for (const auto& routes : index)
      for (int32_t v : routes)
        if (v >= 0) ++kept[v / rows];
    for (int d = 0; d < P; ++d) {
      EXPECT_EQ(pl.kept_rows(d), kept[d]);
      EXPECT_LE(pl.kept_rows(d), rows);
      for (int64_t e = 0; e < E; ++e) EXPECT_LE(pl.offsets_of(d)[e], pl.offsets_of(d)[e + 1]);
    }
  }
}

TEST(Placement, dropless_never_drops) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 50; ++trial) {
    const int P = 1 + static_cast<int>(rng() % 4);
    const int64_t E = 1 + rng() % 3, N = E * P, T = 1 + rng() % 10, K = 1 + rng() % std::min<int64_t>(N, 4);
    Routes topk(P);
    // Odd trials: the worst case, every route of every rank to the experts of rank 0 (a token may
    // repeat an expert here; placement does not care).
    for (auto& routes : topk)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < K; ++k) routes.push_back(static_cast<int32_t>(trial % 2 ? k % E : rng() % N));
    const int64_t rows = rank_capacity(T, K, P, 0.01, /*dropless=*/true);
    EXPECT_EQ(rows, T * K * P);
    const std::vector<int32_t> counts = counts_of(topk, N);
    Placement pl;
    compute_placement(pl, counts.data(), P, N, rows);
    const Routes index = assign_all(topk, pl, counts, T, K, N);
    for (const auto& routes : index)
      for (int32_t v : routes) ASSERT_GE(v, 0);
  }
}

TEST(Placement, capacity_rule) {
  EXPECT_EQ(rank_capacity(10, 2, 4, 1.25, false), 25);
  EXPECT_EQ(rank_capacity(10, 2, 4, 0.25, false), 5);
  EXPECT_EQ(rank_capacity(10, 2, 4, 100.0, false), 80);  // never above the dropless worst case
  EXPECT_EQ(rank_capacity(10, 2, 4, 1.25, true), 80);
  EXPECT_EQ(rank_capacity(10, 2, 1, 1.25, false), 20);  // EP = 1: the local dispatcher's rule
}

TEST(Placement, counts_that_disagree_with_topk_idx_are_an_error) {
  const int64_t N = 2;
  const std::vector<int32_t> topk = {0, 1, 1, 1};
  const std::vector<int32_t> counts = {2, 2};  // wrong: expert 0 has 1 route, expert 1 has 3
  Placement pl;
  compute_placement(pl, counts.data(), 1, N, 4);
  std::vector<int32_t> index(4);
  EXPECT_THROW(assign_routes(index.data(), topk.data(), 2, 2, pl, counts.data(), 0), Error);
}

}  // namespace
}  // namespace moe

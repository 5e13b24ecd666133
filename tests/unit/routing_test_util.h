// Random routings for the routing and row-movement tests (CPU and CUDA): top-K selections, and the
// CPU route ops' expert-major placement of them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "moe/core/rng.h"
#include "moe/core/tensor.h"
#include "moe/ops/route.h"

namespace moe::testing {

// K distinct experts per token [T, K], uniformly at random (a partial Fisher-Yates draw per token),
// never `excluded` (-1: none; ignored when K == N, which takes every expert).
inline std::vector<int32_t> random_topk(int64_t T, int64_t N, int64_t K, uint64_t seed, int32_t excluded = -1) {
  Rng rng(seed);
  std::vector<int32_t> pool, topk(static_cast<size_t>(T * K));
  for (int32_t e = 0; e < N; ++e)
    if (e != excluded || K == N) pool.push_back(e);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t pick = k + static_cast<int64_t>(rng.below(pool.size() - static_cast<size_t>(k)));
      std::swap(pool[static_cast<size_t>(k)], pool[static_cast<size_t>(pick)]);
      topk[static_cast<size_t>(t * K + k)] = pool[static_cast<size_t>(k)];
    }
  return topk;
}

// The CPU route ops' placement of topk [T, K] over N experts, clamped at `capacity` buffer rows
// (tail drop where the routes exceed it): route_counts, then route_index_local.
struct CpuPlacement {
  std::vector<int32_t> counts, route_index, offsets;  // [N], [T K] (-1: dropped), [N + 1]
};
inline CpuPlacement place_on_cpu(std::vector<int32_t> topk, int64_t T, int64_t N, int64_t K, int64_t capacity) {
  CpuPlacement p{std::vector<int32_t>(static_cast<size_t>(N)), std::vector<int32_t>(static_cast<size_t>(T * K)),
                 std::vector<int32_t>(static_cast<size_t>(N + 1))};
  route_counts(i32_tensor(p.counts.data(), {N}), i32_tensor(topk.data(), {T, K}));
  route_index_local(i32_tensor(p.route_index.data(), {T * K}), i32_tensor(p.offsets.data(), {N + 1}),
                    i32_tensor(topk.data(), {T, K}), i32_tensor(p.counts.data(), {N}), capacity);
  return p;
}

}  // namespace moe::testing

// CPU routing metadata. The work is O(T*K) integer bookkeeping done serially, which also makes
// the order of rows within an expert (token, then k) fall out of the loop order directly.
#include "moe/ops/cpu/route.h"

#include <cstdint>
#include <vector>

namespace moe::cpu {

void route_counts(Tensor expert_counts, Tensor topk_idx, Stream /*stream*/) {
  const int64_t N = expert_counts.dim(0);
  int32_t* counts = expert_counts.i32();
  const int32_t* idx = topk_idx.i32();
  for (int64_t e = 0; e < N; ++e) counts[e] = 0;
  for (int64_t i = 0; i < topk_idx.numel(); ++i) ++counts[idx[i]];
}

void route_index_local(Tensor route_index, Tensor expert_offsets, Tensor topk_idx, Tensor expert_counts,
                       int64_t rank_capacity, Stream /*stream*/) {
  const int64_t N = expert_counts.dim(0);
  const int64_t routes = topk_idx.numel();
  const int32_t* counts = expert_counts.i32();
  const int32_t* idx = topk_idx.i32();
  int32_t* offsets = expert_offsets.i32();
  int32_t* index = route_index.i32();

  // cursor[e] = unclamped position of the next row of expert e in the expert-major order.
  std::vector<int64_t> cursor(static_cast<size_t>(N));
  int64_t total = 0;
  offsets[0] = 0;
  for (int64_t e = 0; e < N; ++e) {
    cursor[e] = total;
    total += counts[e];
    offsets[e + 1] = static_cast<int32_t>(total < rank_capacity ? total : rank_capacity);
  }
  // Visiting routes in (t, k) order places each expert's rows in token, then k, order.
  for (int64_t i = 0; i < routes; ++i) {
    const int64_t row = cursor[idx[i]]++;
    index[i] = row < rank_capacity ? static_cast<int32_t>(row) : -1;  // tail drop
  }
}

void accumulate_counts(Tensor load, Tensor counts, Stream /*stream*/) {
  float* l = load.f32();
  const int32_t* c = counts.i32();
  for (int64_t e = 0; e < load.numel(); ++e) l[e] += static_cast<float>(c[e]);
}

}  // namespace moe::cpu

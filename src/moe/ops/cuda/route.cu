// CUDA routing metadata. One block per expert scans all T*K routes in (t, k) order:
//   route_counts: the block counts the routes that select its expert;
//   route_index_local: the block numbers the routes of its expert in (t, k) order (each warp a
//     contiguous segment, counted, then numbered by ballots), so the j-th route to expert e gets the row
//     offsets_unclamped[e] + j (rows expert-major, then token, then k, as on the CPU), and the
//     tail drop clamps at rank_capacity.
// accumulate_counts: one thread per expert adds its count (grid-stride).
// Each output element is written by exactly one thread and all arithmetic is on integers, so the
// results are exact and deterministic. The routes (at most ~262144 I32 = 1 MiB) stay in L2 while
// the N blocks read them.
//
// NOTES: N blocks each reading every route (twice in route_index_local) costs 2 N * T * K loads
// from L2; fine at N <= 128 and T * K ~ 262144. A form with per-block histograms and a decoupled
// look-back would read them once, without changing results.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/route.h"
#include "moe/ops/cuda/route_scan.cuh"

namespace moe::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 16;  // accumulate_counts grid cap

// Block e: expert_counts[e] = number of routes with topk_idx == e.
__global__ void route_counts_kernel(int32_t* __restrict__ expert_counts, const int32_t* __restrict__ topk_idx,
                                    int64_t routes) {
  const int e = blockIdx.x;
  long long count = 0;
  for (int64_t i = threadIdx.x; i < routes; i += kThreads) count += topk_idx[i] == e;
  count = route_scan::block_sum<kThreads>(count);
  if (threadIdx.x == 0) expert_counts[e] = static_cast<int32_t>(count);
}

// Block e: offsets[e+1] = min(sum_{f<=e} counts[f], capacity) (block 0 also offsets[0] = 0), and the
// row of every route to expert e. Block 0 also writes -1 for routes whose expert is not in [0, N).
__global__ void route_index_kernel(int32_t* __restrict__ route_index, int32_t* __restrict__ expert_offsets,
                                   const int32_t* __restrict__ topk_idx, const int32_t* __restrict__ expert_counts,
                                   int64_t routes, int N, int64_t capacity) {
  const int e = blockIdx.x;
  long long part = 0;
  for (int f = threadIdx.x; f < e; f += kThreads) part += expert_counts[f];
  const long long base = route_scan::block_sum<kThreads>(part);  // unclamped row of expert e's first route
  if (threadIdx.x == 0) {
    const long long end = base + expert_counts[e];
    expert_offsets[e + 1] = static_cast<int32_t>(end < capacity ? end : capacity);
    if (e == 0) expert_offsets[0] = 0;
  }
  // Rows base, base + 1, ... in (t, k) order; those at or past capacity are dropped (tail drop).
  route_scan::assign_expert_rows<kThreads>(route_index, topk_idx, routes, N, e, base, capacity - base,
                                           /*mark_invalid=*/e == 0);
}

// load[e] += counts[e], one thread per expert.
__global__ void accumulate_counts_kernel(float* __restrict__ load, const int32_t* __restrict__ counts, int64_t N) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < N;
       e += static_cast<int64_t>(gridDim.x) * kThreads)
    load[e] += static_cast<float>(counts[e]);
}

}  // namespace

void route_counts(Tensor expert_counts, Tensor topk_idx, Stream stream) {
  const int64_t N = expert_counts.dim(0);
  MOE_CHECK(N <= std::numeric_limits<int32_t>::max(), "route_counts: N = ", N, " experts exceed the kernel's grid");
  if (N == 0) return;
  route_counts_kernel<<<static_cast<unsigned>(N), kThreads, 0, cuda_stream(stream)>>>(
      expert_counts.i32(), topk_idx.i32(), topk_idx.numel());
  CUDA_CHECK_LAUNCH();
}

void route_index_local(Tensor route_index, Tensor expert_offsets, Tensor topk_idx, Tensor expert_counts,
                       int64_t rank_capacity, Stream stream) {
  const int64_t N = expert_counts.dim(0);
  const int64_t routes = topk_idx.numel();
  // One block per expert (ops/route.cpp checks the rest of the call).
  MOE_CHECK(N >= 1 && N <= std::numeric_limits<int32_t>::max(), "route_index_local: N = ", N,
            " experts; the CUDA route index needs at least one and at most 2^31 - 1");
  route_index_kernel<<<static_cast<unsigned>(N), kThreads, 0, cuda_stream(stream)>>>(
      route_index.i32(), expert_offsets.i32(), topk_idx.i32(), expert_counts.i32(), routes, static_cast<int>(N),
      rank_capacity);
  CUDA_CHECK_LAUNCH();
}

void accumulate_counts(Tensor load, Tensor counts, Stream stream) {
  const int64_t N = load.numel();
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((N + kThreads - 1) / kThreads, kMaxBlocks));
  accumulate_counts_kernel<<<blocks, kThreads, 0, cuda_stream(stream)>>>(load.f32(), counts.i32(), N);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda

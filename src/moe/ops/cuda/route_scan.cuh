// Device building blocks of the route index, shared by the local route index (ops/cuda/route.cu)
// and the GPU rowwise dispatcher's placement (parallel/cuda_rowwise_dispatcher.cu): fixed-order
// block reductions and the pass that gives one expert's routes their rows in (t, k) order.
// Included only by .cu files; every function must be called by every thread of the block.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moe::cuda::route_scan {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Fixed-order block sum (warp trees, then warps in index order); every thread gets it.
// blockDim.x is a multiple of 32, at most kMaxThreads.
template <int kMaxThreads, typename T>
__device__ T block_sum(T v) {
  __shared__ T warp_totals[kMaxThreads / kWarp];
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  if (threadIdx.x % kWarp == 0) warp_totals[threadIdx.x / kWarp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) total += warp_totals[w];
  __syncthreads();  // warp_totals may be reused by the next call
  return total;
}

// Exclusive prefix of v over the threads of the block (blockDim.x == kThreads) in thread order;
// *total = the block's sum.
template <int kThreads>
__device__ int block_exclusive_scan(int v, int* total) {
  __shared__ int warp_totals[kThreads / kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  int inclusive = v;
  for (int o = 1; o < kWarp; o <<= 1) {
    const int n = __shfl_up_sync(kFullMask, inclusive, o);
    if (lane >= o) inclusive += n;
  }
  if (lane == kWarp - 1) warp_totals[warp] = inclusive;
  __syncthreads();
  int before = 0, sum = 0;
  for (int w = 0; w < kThreads / kWarp; ++w) {
    if (w < warp) before += warp_totals[w];
    sum += warp_totals[w];
  }
  __syncthreads();  // warp_totals may be reused by the next call
  *total = sum;
  return before + inclusive - v;
}

// The j-th route (in (t, k) order) of topk_idx [routes] that selects `expert` gets
// route_index = first_row + j when j < kept, else -1 (tail drop). With mark_invalid the block also
// writes -1 for every route whose expert is outside [0, N) (one block per call should).
// The block reads topk_idx in chunks of kThreads * kItems consecutive routes.
template <int kThreads, int kItems>
__device__ void assign_expert_rows(int32_t* __restrict__ route_index, const int32_t* __restrict__ topk_idx,
                                   int64_t routes, int N, int expert, long long first_row, long long kept,
                                   bool mark_invalid) {
  constexpr int64_t kChunk = static_cast<int64_t>(kThreads) * kItems;
  long long seen = 0;  // routes to `expert` in earlier chunks
  for (int64_t chunk = 0; chunk < routes; chunk += kChunk) {
    const int64_t first = chunk + static_cast<int64_t>(threadIdx.x) * kItems;
    int32_t selected[kItems];
    int mine = 0;
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
      const int64_t i = first + u;
      selected[u] = i < routes ? topk_idx[i] : -1;
      mine += selected[u] == expert;
      if (mark_invalid && i < routes && (selected[u] < 0 || selected[u] >= N)) route_index[i] = -1;
    }
    int chunk_total;
    long long j = seen + block_exclusive_scan<kThreads>(mine, &chunk_total);
#pragma unroll
    for (int u = 0; u < kItems; ++u) {
      if (selected[u] != expert) continue;
      route_index[first + u] = j < kept ? static_cast<int32_t>(first_row + j) : -1;
      ++j;
    }
    seen += chunk_total;
  }
}

}  // namespace moe::cuda::route_scan

// Device building blocks of the route index, shared by the local route index (ops/cuda/route.cu)
// and the GPU rowwise dispatcher's placement (parallel/cuda_rowwise_dispatcher.cu): a fixed-order
// block sum and the passes that give one expert's routes their rows in (t, k) order.
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

// Routes a lane reads at once: 4 consecutive ones (one 16-byte load when `vector` and all 4 lie
// before `end`; past `end`: -1, which selects no expert).
__device__ __forceinline__ void load_routes(const int32_t* __restrict__ topk_idx, int64_t i, int64_t end, bool vector,
                                            int32_t (&sel)[4]) {
  if (vector && i + 4 <= end) {
    const int4 q = *reinterpret_cast<const int4*>(topk_idx + i);
    sel[0] = q.x, sel[1] = q.y, sel[2] = q.z, sel[3] = q.w;
    return;
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) sel[u] = i + u < end ? topk_idx[i + u] : -1;
}

// The j-th route (in (t, k) order) of topk_idx [routes] that selects `expert` gets
// route_index = first_row + j when j < kept, else -1 (tail drop). With mark_invalid the block also
// writes -1 for every route whose expert is outside [0, N) (one block per call should). Returns the
// number of routes to `expert` (to every thread).
//
// Each warp takes one contiguous segment of the routes (a multiple of 128 long, the last one
// shorter): pass 1 counts its routes to `expert`, a scan over the warps gives each segment its first
// j, and pass 2 numbers the segment's routes 128 at a time (4 consecutive ones per lane) by ballots.
// No barrier inside the passes, and the loads of kBatch windows are in flight together. blockDim.x
// must be kThreads.
//
// NOTES: the first form scanned all routes in chunks of kThreads * 8 with a block-wide scan (two
// barriers) per chunk: 128 dependent rounds at bench-olmoe-4l's 262144 routes, 0.28 ms per layer
// in the GPU rowwise dispatcher's placement (bench/RESULTS.md, fourteenth session).
template <int kThreads>
__device__ long long assign_expert_rows(int32_t* __restrict__ route_index, const int32_t* __restrict__ topk_idx,
                                        int64_t routes, int N, int expert, long long first_row, long long kept,
                                        bool mark_invalid) {
  constexpr int kWarps = kThreads / kWarp, kWindow = 4 * kWarp, kBatch = 8;
  __shared__ long long segment_routes[kWarps];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t per_warp = ((routes + kWarps - 1) / kWarps + kWindow - 1) / kWindow * kWindow;
  const int64_t begin = min(static_cast<int64_t>(warp) * per_warp, routes), end = min(begin + per_warp, routes);
  const bool vector = reinterpret_cast<uintptr_t>(topk_idx) % 16 == 0;

  long long count = 0;
  for (int64_t w0 = begin; w0 < end; w0 += kBatch * kWindow) {
    int32_t sel[kBatch][4];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) load_routes(topk_idx, w0 + b * kWindow + 4 * lane, end, vector, sel[b]);
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
#pragma unroll
      for (int u = 0; u < 4; ++u) count += sel[b][u] == expert;
  }
  for (int o = kWarp / 2; o > 0; o >>= 1) count += __shfl_xor_sync(kFullMask, count, o);
  if (lane == 0) segment_routes[warp] = count;
  __syncthreads();
  long long j = 0, total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) j += segment_routes[w];
    total += segment_routes[w];
  }
  __syncthreads();  // segment_routes is free again when the function returns

  const unsigned lower_lanes = (1u << lane) - 1u;
  for (int64_t w0 = begin; w0 < end; w0 += kBatch * kWindow) {
    int32_t sel[kBatch][4];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) load_routes(topk_idx, w0 + b * kWindow + 4 * lane, end, vector, sel[b]);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t i = w0 + b * kWindow + 4 * lane;
      int ahead = 0, window = 0;  // routes to `expert` in lower lanes, in the whole window
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const unsigned hits = __ballot_sync(kFullMask, sel[b][u] == expert);
        ahead += __popc(hits & lower_lanes);
        window += __popc(hits);
      }
      long long r = j + ahead;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (sel[b][u] == expert) {
          route_index[i + u] = r < kept ? static_cast<int32_t>(first_row + r) : -1;
          ++r;
        } else if (mark_invalid && i + u < end && (sel[b][u] < 0 || sel[b][u] >= N)) {
          route_index[i + u] = -1;
        }
      }
      j += window;
    }
  }
  return total;
}

}  // namespace moe::cuda::route_scan

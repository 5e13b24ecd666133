// CUDA routing metadata. One block per expert scans all T*K routes in (t, k) order:
//   route_counts: the block counts the routes that select its expert;
//   route_index_local: the block numbers the routes of its expert in (t, k) order with a
//     block-wide exclusive scan per chunk of routes, so the j-th route to expert e gets the row
//     offsets_unclamped[e] + j (rows expert-major, then token, then k, as on the CPU), and the
//     tail drop clamps at rank_capacity.
// accumulate_counts: one thread per expert adds its count (grid-stride).
// Each output element is written by exactly one thread and all arithmetic is on integers, so the
// results are exact and deterministic. The routes (at most ~262144 I32 = 1 MiB) stay in L2 while
// the N blocks read them.
//
// NOTES: N blocks each reading every route costs N * T * K loads from L2; fine at N <= 128 and
// T * K ~ 262144. A faster form (one pass with per-block histograms and a decoupled look-back)
// can replace it without changing results.
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
constexpr int kItems = 8;                     // consecutive routes per thread per chunk
constexpr int64_t kMaxBlocks = 1 << 16;  // accumulate_counts grid cap

void check_i32(const Tensor& t, const char* op, const char* name) {
  MOE_CHECK(t.data != nullptr || t.numel() == 0, op, ": ", name, " has no data");
  MOE_CHECK(t.device == Device::CUDA, op, ": ", name, " is on ", device_name(t.device), ", expected cuda");
  MOE_CHECK(t.dtype == DType::I32, op, ": ", name, " has dtype ", dtype_name(t.dtype), ", expected I32");
}

void check_f32(const Tensor& t, const char* op, const char* name) {
  MOE_CHECK(t.data != nullptr || t.numel() == 0, op, ": ", name, " has no data");
  MOE_CHECK(t.device == Device::CUDA, op, ": ", name, " is on ", device_name(t.device), ", expected cuda");
  MOE_CHECK(t.dtype == DType::F32, op, ": ", name, " has dtype ", dtype_name(t.dtype), ", expected F32");
}

void check_topk_idx(const Tensor& topk_idx, const char* op) {
  check_i32(topk_idx, op, "topk_idx");
  MOE_CHECK(topk_idx.ndim() == 2, op, ": topk_idx must be [T, K], got ", topk_idx.shape.str());
  MOE_CHECK(topk_idx.numel() <= std::numeric_limits<int32_t>::max(), op, ": ", topk_idx.numel(),
            " routes do not fit I32 row indices");
}


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
  route_scan::assign_expert_rows<kThreads, kItems>(route_index, topk_idx, routes, N, e, base, capacity - base,
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
  constexpr const char* op = "route_counts";
  check_i32(expert_counts, op, "expert_counts");
  MOE_CHECK(expert_counts.ndim() == 1, op, ": expert_counts must be [N], got ", expert_counts.shape.str());
  const int64_t N = expert_counts.dim(0);
  check_topk_idx(topk_idx, op);
  MOE_CHECK(N <= std::numeric_limits<int32_t>::max(), op, ": N = ", N, " experts is too many");
  if (N == 0) return;
  route_counts_kernel<<<static_cast<unsigned>(N), kThreads, 0, cuda_stream(stream)>>>(
      expert_counts.i32(), topk_idx.i32(), topk_idx.numel());
  CUDA_CHECK_LAUNCH();
}

void route_index_local(Tensor route_index, Tensor expert_offsets, Tensor topk_idx, Tensor expert_counts,
                       int64_t rank_capacity, Stream stream) {
  constexpr const char* op = "route_index_local";
  check_i32(expert_counts, op, "expert_counts");
  MOE_CHECK(expert_counts.ndim() == 1, op, ": expert_counts must be [N], got ", expert_counts.shape.str());
  const int64_t N = expert_counts.dim(0);
  MOE_CHECK(N >= 1 && N <= std::numeric_limits<int32_t>::max(), op, ": N = ", N,
            " experts; the CUDA route index needs at least one");
  check_topk_idx(topk_idx, op);
  const int64_t routes = topk_idx.numel();
  check_i32(route_index, op, "route_index");
  MOE_CHECK(route_index.numel() == routes, op, ": route_index has shape ", route_index.shape.str(), ", expected [",
            routes, "] (T*K)");
  check_i32(expert_offsets, op, "expert_offsets");
  MOE_CHECK(expert_offsets.ndim() == 1 && expert_offsets.dim(0) == N + 1, op, ": expert_offsets has shape ",
            expert_offsets.shape.str(), ", expected [", N + 1, "]");
  MOE_CHECK(rank_capacity >= 0, op, ": rank_capacity = ", rank_capacity, " is negative");
  // NOTES: the CPU also checks expert_counts against a histogram of topk_idx; that needs the data on
  // the host, so it is not done here (the caller passes route_counts of this topk_idx).
  route_index_kernel<<<static_cast<unsigned>(N), kThreads, 0, cuda_stream(stream)>>>(
      route_index.i32(), expert_offsets.i32(), topk_idx.i32(), expert_counts.i32(), routes, static_cast<int>(N),
      rank_capacity);
  CUDA_CHECK_LAUNCH();
}

void accumulate_counts(Tensor load, Tensor counts, Stream stream) {
  constexpr const char* op = "accumulate_counts";
  check_f32(load, op, "load");
  MOE_CHECK(load.ndim() == 1, op, ": load must be [N], got ", load.shape.str());
  check_i32(counts, op, "counts");
  MOE_CHECK(counts.shape == load.shape, op, ": counts has shape ", counts.shape.str(), ", expected ", load.shape.str(),
            " (one count per expert of load)");
  const int64_t N = load.numel();
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((N + kThreads - 1) / kThreads, kMaxBlocks));
  accumulate_counts_kernel<<<blocks, kThreads, 0, cuda_stream(stream)>>>(load.f32(), counts.i32(), N);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda

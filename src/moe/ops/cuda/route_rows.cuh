// Per-token kernels over a token's K routed rows, shared by the local ops (ops/cuda/permute.cu)
// and the GPU rowwise dispatcher (parallel/cuda_rowwise_dispatcher.cu), which differ only in where
// a route's row lives: a Row functor maps a route's row index v to a pointer to the row, or
// nullptr for a dropped route (ops: a local buffer; dispatcher: some rank's heap segment).
//
//   scatter_routes_kernel:   row(t, k) = x[t] for every kept route: the gather into expert-major
//                            rows and the dispatch;
//   scatter_routes_fp8_kernel: the same with x[t] quantized once into 1 x 128 FP8 tiles (codes
//                            and scales to separate rows): the FP8 dispatch (ep.payload = "fp8");
//   sum_routes_kernel:       out[t] (+= when accumulate, else =) sum over kept k, ascending, of
//                            w[t,k] * row(t,k) (w = 1 when weights is null): the weighted combine
//                            and the gather / dispatch backward;
//   combine_backward_kernel: for each kept (t, k): dy_row(t,k) = w[t,k] * dout[t] and
//                            dweights[t,k] = dot(dout[t], y_row(t,k)); dweights = 0 when dropped;
//                            a null dy row is not written (weights may then be null).
//
// One block per token, one thread per chunk of V elements (16 bytes when the caller could align
// them). Rows are read at L2 (ld.global.cg), so a peer's rows are never served from a stale L1
// line.
//
// NOTES: how these kernels keep HBM busy. A token's K rows sit at unrelated addresses; loading row
// k only after the sum of rows 0..k-1 leaves one 16-byte load in flight per thread, and the first
// versions ran at ~40% of HBM bandwidth (0.43-0.64 ms per call at T 32768, d 2048, K 4 on the
// H200). So (1) the block locates the token's rows once, into shared memory (a peer row takes a
// 64-bit division: not once per thread); (2) each thread issues the loads of a group of G routes
// (G = top_k rounded up to a power of two, at most 8) before summing them; (3) G is a template
// parameter and the launch bounds ask for 4 blocks per SM (2 for G = 8): a fixed group of 8 took
// 108-158 registers, one or two blocks per SM, and ran no faster than the old kernels.
// The arithmetic is unchanged (FP32, __fmul_rn and __fadd_rn never fused into an FMA, k
// ascending; one rounding on store), so the results are the bits of the one-row-at-a-time kernels,
// and in F32 those of the CPU's loops. The dweights dot products run per thread in element order,
// then a fixed-order block reduction (warp trees, then warps in index order): deterministic, but
// another summation order than the CPU's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "moe/core/fp8.h"
#include "moe/ops/cuda/element.cuh"
#include "moe/ops/cuda/fp8_tiles.cuh"
#include "moe/ops/fp8.h"

namespace moe::cuda::route_rows {

constexpr int kMaxRouteGroup = 8;  // most routes of a token whose row loads are issued together
constexpr int kMaxThreads = 256;
constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// Chunk c of a row, loaded at L2 (ld.global.cg).
template <typename Elem, int V>
__device__ __forceinline__ Pack<Elem, V> load_cg(const Elem* row, int64_t c) {
  Pack<Elem, V> p;
  if constexpr (sizeof(p) == 16) {
    const uint4 w = __ldcg(reinterpret_cast<const uint4*>(row) + c);
    memcpy(&p, &w, sizeof(p));
  } else if constexpr (sizeof(p) == 4) {
    const unsigned w = __ldcg(reinterpret_cast<const unsigned*>(row) + c);
    memcpy(&p, &w, sizeof(p));
  } else {
    static_assert(sizeof(p) == 2, "rows are BF16 or F32");
    const unsigned short w = __ldcg(reinterpret_cast<const unsigned short*>(row) + c);
    memcpy(&p, &w, sizeof(p));
  }
  return p;
}

// Threads per token block: enough warps for the row's chunks, at most kMaxThreads.
inline unsigned threads_for(int64_t chunks) {
  int64_t warps = (chunks + kWarp - 1) / kWarp;
  warps = warps < 1 ? 1 : (warps > kMaxThreads / kWarp ? kMaxThreads / kWarp : warps);
  return static_cast<unsigned>(warps * kWarp);
}

// Fixed-order block sums of N values at once (warp trees, then warps in index order, as
// route_scan::block_sum does for one); every thread gets the totals and must call it.
template <int N>
__device__ void block_sums(float (&v)[N]) {
  __shared__ float warp_totals[N][kMaxThreads / kWarp];
#pragma unroll
  for (int j = 0; j < N; ++j) {
    for (int o = kWarp / 2; o > 0; o >>= 1) v[j] += __shfl_xor_sync(kFullMask, v[j], o);
    if (threadIdx.x % kWarp == 0) warp_totals[j][threadIdx.x / kWarp] = v[j];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < N; ++j) {
    float total = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) total += warp_totals[j][w];
    v[j] = total;
  }
  __syncthreads();  // warp_totals may be reused by the next call
}

// The route-group width G for top_k routes per token: the smallest power of two >= top_k, at
// most kMaxRouteGroup. Calls f(std::integral_constant<int, G>{}). Host code.
template <typename F>
void with_route_group(int top_k, F&& f) {
  if (top_k <= 1)
    f(std::integral_constant<int, 1>{});
  else if (top_k <= 2)
    f(std::integral_constant<int, 2>{});
  else if (top_k <= 4)
    f(std::integral_constant<int, 4>{});
  else
    f(std::integral_constant<int, kMaxRouteGroup>{});
}

// Dynamic shared memory of the kernels below: the token's route rows (and weights) for top_k routes.
inline size_t sum_routes_smem(int top_k) { return static_cast<size_t>(top_k) * (sizeof(void*) + sizeof(float)); }
inline size_t scatter_routes_smem(int top_k) { return static_cast<size_t>(top_k) * sizeof(void*); }
inline size_t scatter_routes_fp8_smem(int top_k) { return static_cast<size_t>(top_k) * 2 * sizeof(void*); }
inline size_t combine_backward_smem(int top_k) {
  return static_cast<size_t>(top_k) * (2 * sizeof(void*) + sizeof(float));
}

// Blocks per SM the register budget is set for: G row words in flight per thread need registers.
template <int G>
constexpr int min_blocks() {
  return G <= 4 ? 4 : 2;
}

extern __shared__ __align__(16) unsigned char route_rows_smem[];

// Launch: one block per token (grid-stride), threads_for(D / V) threads, sum_routes_smem(top_k)
// bytes of dynamic shared memory.
template <typename Elem, int V, int G, class Row>
__global__ void __launch_bounds__(kMaxThreads, min_blocks<G>())
    sum_routes_kernel(Elem* __restrict__ out, Row row_of, const float* __restrict__ weights, bool accumulate,
                      const int32_t* __restrict__ route_index, int top_k, int64_t T, int64_t D) {
  using P = Pack<Elem, V>;
  const Elem** s_rows = reinterpret_cast<const Elem**>(route_rows_smem);
  float* s_w = reinterpret_cast<float*>(s_rows + top_k);
  const int64_t chunks = D / V;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    // The token's rows, located once per block (the Row functor may divide: not once per thread).
    for (int k = threadIdx.x; k < top_k; k += blockDim.x) {
      s_rows[k] = row_of(route_index[t * top_k + k]);
      s_w[k] = weights == nullptr ? 1.0f : weights[t * top_k + k];
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      float acc[V];
#pragma unroll
      for (int u = 0; u < V; ++u) acc[u] = 0.0f;
      for (int k0 = 0; k0 < top_k; k0 += G) {
        const Elem* rows[G];
        P y[G];
#pragma unroll
        for (int j = 0; j < G; ++j) rows[j] = k0 + j < top_k ? s_rows[k0 + j] : nullptr;
#pragma unroll
        for (int j = 0; j < G; ++j)
          if (rows[j] != nullptr) y[j] = load_cg<Elem, V>(rows[j], c);
#pragma unroll
        for (int j = 0; j < G; ++j) {
          if (rows[j] == nullptr) continue;  // a dropped route (or past top_k) contributes nothing
          if (weights == nullptr) {
#pragma unroll
            for (int u = 0; u < V; ++u) acc[u] = __fadd_rn(acc[u], to_f32(y[j].e[u]));
          } else {
            const float wk = s_w[k0 + j];
#pragma unroll
            for (int u = 0; u < V; ++u) acc[u] = __fadd_rn(acc[u], __fmul_rn(wk, to_f32(y[j].e[u])));
          }
        }
      }
      P* o = reinterpret_cast<P*>(out + t * D) + c;
      P r;
      if (accumulate) r = *o;
#pragma unroll
      for (int u = 0; u < V; ++u) r.e[u] = from_f32<Elem>(accumulate ? __fadd_rn(to_f32(r.e[u]), acc[u]) : acc[u]);
      *o = r;
    }
    __syncthreads();  // the next token overwrites s_rows
  }
}

// row(t, k) = x[t] for every kept route of token t: the gather into expert-major rows and the
// dispatch (PUT). x's row is read once per token and stored K times. Launch as sum_routes_kernel,
// with scatter_routes_smem(top_k) bytes of dynamic shared memory.
template <typename Elem, int V, class Row>
__global__ void __launch_bounds__(kMaxThreads)
    scatter_routes_kernel(const Elem* __restrict__ x, Row row_of, const int32_t* __restrict__ route_index, int top_k,
                          int64_t T, int64_t D) {
  using P = Pack<Elem, V>;
  Elem** s_rows = reinterpret_cast<Elem**>(route_rows_smem);
  const int64_t chunks = D / V;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    for (int k = threadIdx.x; k < top_k; k += blockDim.x) s_rows[k] = row_of(route_index[t * top_k + k]);
    __syncthreads();
    const P* from = reinterpret_cast<const P*>(x + t * D);
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const P v = from[c];
      for (int k = 0; k < top_k; ++k)
        if (s_rows[k] != nullptr) reinterpret_cast<P*>(s_rows[k])[c] = v;  // dropped routes move nothing
    }
    __syncthreads();  // the next token overwrites s_rows
  }
}

// The FP8 dispatch: token t's row quantized once into 1 x 128 tiles and stored into every kept
// route's codes row (CodesRow: v -> uint8_t*, D codes) and scales row (ScalesRow: v -> float*,
// ceil(D / 128) scales); both return nullptr for a dropped route. Each warp takes the token's tiles
// in turn, a lane 4 consecutive elements of the tile; the tile's amax (the largest |x| bits, as the
// CPU takes it) by warp shuffles, then fp8::tile_scale and the quantize kernels' TileQuantizer
// (fp8_tiles.cuh: the hardware E4M3 conversion), so codes and scales are fp8_quantize_rows' bits. A
// lane stores its 4 codes as one word when word_stores (D % 4 == 0 and 4-byte aligned codes rows),
// else byte by byte; lane 0 stores the scale. Launch: one block per token (grid-stride),
// threads_for(tiles * 32) threads, scatter_routes_fp8_smem(top_k) bytes of dynamic shared memory.
template <typename Elem, class CodesRow, class ScalesRow>
__global__ void __launch_bounds__(kMaxThreads)
    scatter_routes_fp8_kernel(const Elem* __restrict__ x, CodesRow codes_of, ScalesRow scales_of,
                              const int32_t* __restrict__ route_index, int top_k, int64_t T, int64_t D,
                              bool word_stores) {
  constexpr int64_t kTile = kFp8Tile;
  static_assert(kTile == 4 * kWarp, "a lane quantizes 4 elements of a 128-element tile");
  uint8_t** s_codes = reinterpret_cast<uint8_t**>(route_rows_smem);
  float** s_scales = reinterpret_cast<float**>(s_codes + top_k);
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const int64_t tiles = (D + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    for (int k = threadIdx.x; k < top_k; k += blockDim.x) {
      const int32_t v = route_index[t * top_k + k];
      s_codes[k] = codes_of(v);
      s_scales[k] = s_codes[k] != nullptr ? scales_of(v) : nullptr;
    }
    __syncthreads();
    const Elem* row = x + t * D;
    for (int64_t j = warp; j < tiles; j += warps) {  // the same trip count for the whole warp
      const int64_t c0 = j * kTile + 4 * lane;
      const int valid = static_cast<int>(c0 < D ? (D - c0 < 4 ? D - c0 : 4) : 0);
      float v[4];
      uint32_t amax = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        v[e] = e < valid ? to_f32(row[c0 + e]) : 0.0f;
        amax = max(amax, __float_as_uint(v[e]) & 0x7fffffffu);
      }
#pragma unroll
      for (int d = kWarp / 2; d > 0; d >>= 1) amax = max(amax, __shfl_xor_sync(kFullMask, amax, d));
      const float scale = fp8::tile_scale(__uint_as_float(amax));
      const fp8_tiles::TileQuantizer quantize(scale);
      const uint32_t word = quantize.word(v[0], v[1], v[2], v[3]);
      for (int k = 0; k < top_k; ++k) {
        uint8_t* codes = s_codes[k];
        if (codes == nullptr) continue;  // dropped routes move nothing
        if (lane == 0) s_scales[k][j] = scale;
        if (word_stores && valid == 4) {
          *reinterpret_cast<uint32_t*>(codes + c0) = word;
        } else {
          for (int e = 0; e < valid; ++e) codes[c0 + e] = static_cast<uint8_t>(word >> (8 * e));
        }
      }
    }
    __syncthreads();  // the next token overwrites s_codes and s_scales
  }
}

// YRow maps v to const Elem* (the expert output row), DyRow to Elem* (its gradient row). Launch as
// sum_routes_kernel, with combine_backward_smem(top_k) bytes of dynamic shared memory.
template <typename Elem, int V, int G, class YRow, class DyRow>
__global__ void __launch_bounds__(kMaxThreads, min_blocks<G>())
    combine_backward_kernel(float* __restrict__ dweights, const Elem* __restrict__ dout,
                            const float* __restrict__ weights, YRow y_of, DyRow dy_of,
                            const int32_t* __restrict__ route_index, int top_k, int64_t T, int64_t D) {
  using P = Pack<Elem, V>;
  const Elem** s_y = reinterpret_cast<const Elem**>(route_rows_smem);
  Elem** s_dy = reinterpret_cast<Elem**>(route_rows_smem + static_cast<size_t>(top_k) * sizeof(void*));
  float* s_w = reinterpret_cast<float*>(s_dy + top_k);
  const int64_t chunks = D / V;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    for (int k = threadIdx.x; k < top_k; k += blockDim.x) {
      const int32_t v = route_index[t * top_k + k];
      s_y[k] = y_of(v);
      s_dy[k] = s_y[k] != nullptr ? dy_of(v) : nullptr;
      s_w[k] = weights != nullptr ? weights[t * top_k + k] : 0.0f;
    }
    __syncthreads();
    const P* g = reinterpret_cast<const P*>(dout + t * D);
    for (int k0 = 0; k0 < top_k; k0 += G) {  // the same trip count for every thread
      float dot[G];
#pragma unroll
      for (int j = 0; j < G; ++j) dot[j] = 0.0f;
      for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
        const P gc = g[c];
        const Elem* y_rows[G];
        P y[G];
#pragma unroll
        for (int j = 0; j < G; ++j) y_rows[j] = k0 + j < top_k ? s_y[k0 + j] : nullptr;
#pragma unroll
        for (int j = 0; j < G; ++j)
          if (y_rows[j] != nullptr) y[j] = load_cg<Elem, V>(y_rows[j], c);
#pragma unroll
        for (int j = 0; j < G; ++j) {
          if (y_rows[j] == nullptr) continue;
          const float wk = s_w[k0 + j];
          P dyc;
#pragma unroll
          for (int u = 0; u < V; ++u) {
            const float gu = to_f32(gc.e[u]);
            dot[j] = fmaf(gu, to_f32(y[j].e[u]), dot[j]);
            dyc.e[u] = from_f32<Elem>(__fmul_rn(wk, gu));
          }
          if (s_dy[k0 + j] != nullptr) reinterpret_cast<P*>(s_dy[k0 + j])[c] = dyc;
        }
      }
      block_sums(dot);
      if (threadIdx.x == 0) {
#pragma unroll
        for (int j = 0; j < G; ++j)
          if (k0 + j < top_k) dweights[t * top_k + k0 + j] = s_y[k0 + j] != nullptr ? dot[j] : 0.0f;
      }
    }
    __syncthreads();  // thread 0 has read s_y; the next token overwrites it
  }
}

// Host launchers: one block per token (at most kMaxBlocks, then grid-stride), T >= 1.
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

template <typename Elem, int V, class Row>
void launch_sum_routes(Elem* out, Row row_of, const float* weights, bool accumulate, const int32_t* route_index,
                       int top_k, int64_t T, int64_t D, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(T < kMaxBlocks ? T : kMaxBlocks);
  with_route_group(top_k, [&](auto group) {
    sum_routes_kernel<Elem, V, decltype(group)::value><<<grid, threads_for(D / V), sum_routes_smem(top_k), stream>>>(
        out, row_of, weights, accumulate, route_index, top_k, T, D);
  });
}

template <typename Elem, int V, class Row>
void launch_scatter_routes(const Elem* x, Row row_of, const int32_t* route_index, int top_k, int64_t T, int64_t D,
                           cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(T < kMaxBlocks ? T : kMaxBlocks);
  scatter_routes_kernel<Elem, V><<<grid, threads_for(D / V), scatter_routes_smem(top_k), stream>>>(
      x, row_of, route_index, top_k, T, D);
}

template <typename Elem, class CodesRow, class ScalesRow>
void launch_scatter_routes_fp8(const Elem* x, CodesRow codes_of, ScalesRow scales_of, const int32_t* route_index,
                               int top_k, int64_t T, int64_t D, bool word_stores, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(T < kMaxBlocks ? T : kMaxBlocks);
  const int64_t tiles = (D + kFp8Tile - 1) / kFp8Tile;
  scatter_routes_fp8_kernel<Elem><<<grid, threads_for(tiles * kWarp), scatter_routes_fp8_smem(top_k), stream>>>(
      x, codes_of, scales_of, route_index, top_k, T, D, word_stores);
}

template <typename Elem, int V, class YRow, class DyRow>
void launch_combine_backward(float* dweights, const Elem* dout, const float* weights, YRow y_of, DyRow dy_of,
                             const int32_t* route_index, int top_k, int64_t T, int64_t D, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(T < kMaxBlocks ? T : kMaxBlocks);
  with_route_group(top_k, [&](auto group) {
    combine_backward_kernel<Elem, V, decltype(group)::value>
        <<<grid, threads_for(D / V), combine_backward_smem(top_k), stream>>>(dweights, dout, weights, y_of, dy_of,
                                                                           route_index, top_k, T, D);
  });
}

}  // namespace moe::cuda::route_rows

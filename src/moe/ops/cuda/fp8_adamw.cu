// The AdamW update of a quantized weight that writes its FP8 caches in the same pass (semantics:
// moe/ops/fp8_adamw.h).
//
// One 256-thread block per 128 x 128 weight block: it updates the block's elements, then
// quantizes the updated block exactly as quantize_blocks_kernel does (fp8_block_tile.cuh's
// load_tile and store_block). The element update is adamw_math's, the flat kernel's, so param, m
// and v get adamw_step's bits, and the codes and scales fp8_quantize_blocks' bits of the new param.
// HBM traffic per element (FP32 moments): 16 bytes read and 12 written by the update, plus 2 bytes
// of codes, against 28 for the update and then 4 read + 2 written by a separate quantize pass.
#include "moe/ops/cuda/fp8_adamw.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/adamw_math.cuh"
#include "moe/ops/cuda/fp8_block_tile.cuh"

namespace moe::cuda {
namespace {

using namespace fp8_tiles;
using namespace adamw_math;

// param, grad, m, v [E, N, K] (flat, row-major); vector: 16-byte (FP32) or 8-byte (BF16 moments)
// accesses of 4 elements are aligned for every run that starts on a multiple of 4 (K % 4 == 0 and
// aligned bases).
// Two phases per block. The update streams the block's rows: each thread takes runs of 4 elements
// (consecutive threads consecutive runs of a row) and loads kBatch runs of every operand before it
// computes and stores any, so a thread keeps 4 kBatch loads of each operand in flight (a first
// version kept the new values in registers for the quantization and updated one run at a time,
// with a load after every store: 2.4 TB/s, slower than the two passes it replaced). Then, after a
// barrier (which makes the block's global writes visible to all its threads), the quantization
// reads the updated block back in the quantizer's layout: 64 KiB the block has just written, from
// L2, not HBM.
constexpr int kBatch = 4;

template <typename Moment>
__device__ __forceinline__ void update_run(float* param, const float* grad, Moment* m, Moment* v, int64_t at,
                                           int valid, bool vector, const AdamWScalars& s) {
  if (vector && valid == 4) {
    float4 p = *reinterpret_cast<const float4*>(param + at);
    const float4 g = *reinterpret_cast<const float4*>(grad + at);
    float4 mm = load4(m + at, 0), vv = load4(v + at, 0);
    adamw_update4(p, g, mm, vv, s);
    *reinterpret_cast<float4*>(param + at) = p;
    store4(m + at, 0, mm);
    store4(v + at, 0, vv);
    return;
  }
  for (int x = 0; x < valid; ++x) {
    float mi = load_moment(m, at + x), vi = load_moment(v, at + x);
    param[at + x] = adamw_update(param[at + x], grad[at + x], mi, vi, s);
    store_moment(m, at + x, mi);
    store_moment(v, at + x, vi);
  }
}

template <typename Moment>
__global__ void __launch_bounds__(kThreads, 2)
    adamw_quantize_blocks_kernel(float* param, const float* __restrict__ grad, Moment* __restrict__ m,
                                 Moment* __restrict__ v, const float* grad_norm_sq, float max_norm, float b1, float b2,
                                 float eps, float step_size, float bias2_sqrt, float decay, const float* schedule,
                                 float wd, BlockTarget target, bool vector) {
  AdamWScalars s;
  if (!step_scalars(grad_norm_sq, max_norm, b1, b2, eps, step_size, bias2_sqrt, decay, schedule, wd, s)) return;
  __shared__ TileShared sh;
  const TileThread t;
  const int64_t N = target.N, K = target.K;
  const int64_t e = blockIdx.x / (target.n_tiles * target.k_tiles);
  const int64_t bi = (blockIdx.x / target.k_tiles) % target.n_tiles, bj = blockIdx.x % target.k_tiles;
  const int64_t n0 = bi * kTile, k0 = bj * kTile;
  const int rows = static_cast<int>(min(N - n0, int64_t{kTile}));
  const int cols = static_cast<int>(min(K - k0, int64_t{kTile}));
  const int64_t base = (e * N + n0) * K + k0;  // element (0, 0) of the block

  // 1. The update: run j of the block is row j / runs_per_row, columns 4 (j % runs_per_row) + [0, 4).
  const int runs_per_row = (cols + 3) / 4, runs = rows * runs_per_row;
  for (int first = static_cast<int>(threadIdx.x); first < runs; first += kThreads * kBatch) {
    if (vector && first + (kBatch - 1) * kThreads < runs && cols == kTile) {
      // kBatch whole runs: every load before any store.
      float4 p[kBatch], g[kBatch], mm[kBatch], vv[kBatch];
      int64_t at[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int j = first + u * kThreads;
        at[u] = base + (j / runs_per_row) * K + 4 * (j % runs_per_row);
        p[u] = *reinterpret_cast<const float4*>(param + at[u]);
        g[u] = *reinterpret_cast<const float4*>(grad + at[u]);
        mm[u] = load4(m + at[u], 0);
        vv[u] = load4(v + at[u], 0);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        adamw_update4(p[u], g[u], mm[u], vv[u], s);
        *reinterpret_cast<float4*>(param + at[u]) = p[u];
        store4(m + at[u], 0, mm[u]);
        store4(v + at[u], 0, vv[u]);
      }
      continue;
    }
    for (int u = 0; u < kBatch; ++u) {
      const int j = first + u * kThreads;
      if (j >= runs) break;
      const int c = 4 * (j % runs_per_row);
      update_run(param, grad, m, v, base + (j / runs_per_row) * K + c, min(cols - c, 4), vector, s);
    }
  }
  __syncthreads();

  // 2. The caches of the updated block, as fp8_quantize_blocks writes them.
  float w[4][4][4];
  load_tile(param + e * N * K, K, n0, rows, k0, cols, vector, t, w);
  store_block(w, target, e, bi, bj, rows, cols, t, sh);
}

template <typename Moment>
void launch(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm, const AdamWConfig& cfg,
            const HostScalars& h, const BlockTarget& target, int64_t blocks, Stream stream, Tensor schedule) {
  const bool vector = target.K % 4 == 0 && aligned(param.data, 16) && aligned(grad.data, 16) &&
                      aligned(m.data, 4 * sizeof(Moment)) && aligned(v.data, 4 * sizeof(Moment));
  adamw_quantize_blocks_kernel<Moment><<<static_cast<unsigned>(blocks), kThreads, 0, cuda_stream(stream)>>>(
      param.ptr<float>(), grad.ptr<const float>(), m.ptr<Moment>(), v.ptr<Moment>(), grad_norm_sq.ptr<const float>(),
      max_norm, cfg.beta1, cfg.beta2, cfg.eps, h.step_size, h.bias2_sqrt, h.decay,
      schedule.empty() ? nullptr : schedule.ptr<const float>(), cfg.weight_decay, target, vector);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void adamw_step_quantize_blocks(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                                const AdamWConfig& cfg, int64_t step, Fp8Tensor out, Fp8Tensor out_t, Stream stream,
                                Tensor schedule) {
  const int64_t N = param.dim(-2), K = param.dim(-1);
  const int64_t E = param.ndim() == 3 ? param.dim(0) : 1;
  if (E == 0 || N == 0 || K == 0) return;
  const bool transposed = !out_t.codes.empty();
  const int64_t n_tiles = tiles(N), k_tiles = tiles(K), blocks = E * n_tiles * k_tiles;
  MOE_CHECK(blocks <= 2147483647, "adamw_step_quantize_blocks: ", blocks, " blocks exceed one launch");
  const BlockTarget target{out.codes.ptr<uint8_t>(),
                           out.scales.ptr<float>(),
                           transposed ? out_t.codes.ptr<uint8_t>() : nullptr,
                           transposed ? out_t.scales.ptr<float>() : nullptr,
                           N,
                           K,
                           n_tiles,
                           k_tiles,
                           K % 4 == 0 && aligned(out.codes.data, 4),
                           transposed && N % 4 == 0 && aligned(out_t.codes.data, 4)};
  const HostScalars h = schedule.empty() ? host_scalars(cfg, step) : HostScalars{};
  if (m.dtype == DType::BF16)
    launch<__nv_bfloat16>(param, grad, m, v, grad_norm_sq, max_norm, cfg, h, target, blocks, stream, schedule);
  else
    launch<float>(param, grad, m, v, grad_norm_sq, max_norm, cfg, h, target, blocks, stream, schedule);
}

}  // namespace moe::cuda

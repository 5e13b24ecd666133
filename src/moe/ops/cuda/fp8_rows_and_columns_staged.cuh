// The pieces of the rows-and-columns quantizers that stage BF16 column tiles in shared memory: the
// cp.async tile copy, the Rows and columns halves of a staged tile, the resident grid. Their kernels:
// fp8_quantize_rows_and_columns's hot case (a stored BF16 tensor, every FP8 layer's output gradient;
// fp8_quantize.cu, with the design notes) and the SwiGLU backward that quantizes d(gate/up)
// (fp8_swiglu_staged.cu). Include only from .cu files.
//
// Why staged: the one-block-per-tile kernel (fp8_tiles.cuh) gives each lane 4 rows x 32 bytes, so
// each of a warp's loads touches 32 rows' cache lines for 32 bytes each, and with the Rows output
// each block holds 64 values per lane in registers across a barrier; it ran at 1.9 TB/s where the
// Rows quantizer runs at 2.7 and a copy at 4.2. Here a block stays resident and loops over tiles:
// while it quantizes tile i out of one 32 KiB stage, tile i + 1 streams into the other with
// cp.async, 16 threads per 256-byte row (a warp's load covers two rows whole). The Rows output is
// made from the stage in the same coalesced order (16 threads per row, the row amax by 4 shuffles,
// 8 codes per thread), so it needs no row amax table. Without the Rows output the one-block-per-tile
// kernel was faster in the training step (4.06 against 3.54 ms per step, bench/RESULTS.md), so
// fp8_quantize_columns keeps it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>

#include "moe/ops/cuda/fp8_tiles.cuh"

namespace moe::cuda::fp8_tiles {

constexpr int kStageChunks = kTile * 2 / 16;                         // 16-byte chunks per BF16 tile row
constexpr int kStageWords = kTile * kStageChunks;                    // uint4 per stage (32 KiB)
constexpr size_t kStagedSharedBytes = 2 * kStageWords * sizeof(uint4);  // two stages

// A chunk's place in a stage: row-major, the chunk index XOR-ed with bits 2..4 of the row, so the 8
// lanes of a quarter-warp reading one chunk of rows 4 l + s (the columns half) and those reading 8
// chunks of one row (the Rows half) hit 8 different 16-byte bank groups.
__device__ __forceinline__ int stage_slot(int row, int chunk) {
  return row * kStageChunks + (chunk ^ ((row >> 2) & 7));
}

// Starts copying x rows [tile.first_row, + tile.rows) x features [k0, k0 + 128) into `stage` (x's
// rows `stride` elements apart, K features each); the kBlockThreads threads of the block share the
// chunks, `thread` being the caller's index among them. Chunks past the rows or past K are
// zero-filled (cp.async with source size 0 reads nothing).
template <int kBlockThreads = kThreads>
__device__ __forceinline__ void copy_tile_async(uint4* stage, const __nv_bfloat16* x, int64_t stride, int64_t K,
                                                TileRows tile, int64_t k0, int thread) {
#pragma unroll
  for (int j = 0; j < kStageWords / kBlockThreads; ++j) {
    const int i = thread + j * kBlockThreads;
    const int r = i / kStageChunks, c = i % kStageChunks;
    const int64_t k = k0 + 8 * c;
    const bool inside = r < tile.rows && k < K;  // K % 8 == 0: a chunk is all in or all out
    const __nv_bfloat16* src = inside ? x + (tile.first_row + r) * stride + k : x;
    __pipeline_memcpy_async(stage + stage_slot(r, c), src, sizeof(uint4), inside ? 0 : sizeof(uint4));
  }
}

// The Rows tiles of the staged tile: 16 threads per row (8 features each), the row amax by
// shuffles within the 16 (two features per word), 8 codes (8 bytes) stored per thread; kThreads
// threads take the tile, `thread` (0 .. kThreads - 1, whole warps) being the caller's index among
// them. out.codes must be 8-byte aligned and K % 8 == 0 (rows_and_columns_staged_fit).
__device__ __forceinline__ void store_staged_row_tiles(const uint4* stage, TileRows tile, int64_t k0, int64_t K,
                                                       const RowsOutput& out, int thread) {
  const int c = thread % kStageChunks;
  const int64_t row_tiles = (K + kTile - 1) / kTile;
  const bool inside_k = k0 + 8 * c < K;
#pragma unroll 2
  for (int j = 0; j < kStageWords / kThreads; ++j) {
    const int r = thread / kStageChunks + j * (kThreads / kStageChunks);
    const uint4 q = stage[stage_slot(r, c)];
    constexpr uint32_t kMagnitudes = 0x7fff7fffu;  // two BF16 magnitudes, amax by max.u16x2
    uint32_t m = max_u16x2(max_u16x2(q.x & kMagnitudes, q.y & kMagnitudes),
                           max_u16x2(q.z & kMagnitudes, q.w & kMagnitudes));
#pragma unroll
    for (int d = kStageChunks / 2; d > 0; d >>= 1) m = max_u16x2(m, __shfl_xor_sync(kFullMask, m, d));
    if (r >= tile.rows) continue;  // after the shuffles: the 16 lanes of a row agree
    const float scale = fp8::tile_scale(__uint_as_float(max(m << 16, m & 0xffff0000u)));
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    float v[8];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[2 * e] = __uint_as_float(w[e] << 16);
      v[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
    }
    const int64_t row = tile.first_row + r;
    if (c == 0) out.scales[row * row_tiles + k0 / kTile] = scale;
    if (!inside_k) continue;
    const TileQuantizer quantize(scale);
    *reinterpret_cast<uint2*>(out.codes + row * K + k0 + 8 * c) =
        make_uint2(quantize.word(v[0], v[1], v[2], v[3]), quantize.word(v[4], v[5], v[6], v[7]));
  }
}

// The columns half of the staged tile: warp `warp` (0 .. 7) takes features k0 + 16 warp .. + 15
// (chunks 2 warp and 2 warp + 1), lane l rows 4 l .. 4 l + 3.
__device__ __forceinline__ void store_staged_column_tile(const uint4* stage, TileRows tile, int64_t column_tile,
                                                         int64_t k0, int64_t K, const ColumnsOutput& out, int warp) {
  const int lane = threadIdx.x & 31;
  Run16<__nv_bfloat16> run[4];
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const int r = 4 * lane + s;
    const uint4 a = stage[stage_slot(r, 2 * warp)], b = stage[stage_slot(r, 2 * warp + 1)];
    run[s].w[0] = a.x, run[s].w[1] = a.y, run[s].w[2] = a.z, run[s].w[3] = a.w;
    run[s].w[4] = b.x, run[s].w[5] = b.y, run[s].w[6] = b.z, run[s].w[7] = b.w;
  }
  const int64_t kw = k0 + kRun * warp;
  const int features = static_cast<int>(min(max(K - kw, int64_t{0}), int64_t{kRun}));
  store_column_tile(run, out, column_tile, kw, features, tile.rows);
}

// Resident blocks of kKernel (block_threads threads, `shared` bytes of dynamic shared memory) on
// the current device: SMs x blocks per SM. Asked of the runtime once per device and kernel (the
// kernel's dynamic shared memory limit is raised there too), then cached: nothing but a launch on
// the later calls.
template <auto kKernel>
int resident_grid(int block_threads, size_t shared, const char* name) {
  static std::array<std::atomic<int>, 64> cached{};
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  MOE_CHECK(device < static_cast<int>(cached.size()), name, ": device ", device, " past the cache");
  int grid = cached[device].load(std::memory_order_relaxed);
  if (grid > 0) return grid;
  CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  int per_sm = 0, sms = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, block_threads, shared));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  MOE_CHECK(per_sm > 0, name, ": no block of ", shared, " bytes of shared memory fits");
  grid = per_sm * sms;
  cached[device].store(grid, std::memory_order_relaxed);
  return grid;
}

}  // namespace moe::cuda::fp8_tiles

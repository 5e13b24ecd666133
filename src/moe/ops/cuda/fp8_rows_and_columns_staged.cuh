// The quantizers that stage BF16 column tiles in shared memory: the cp.async tile copy, the Rows and
// columns halves of a staged tile, the staged kernel (quantize_columns_staged_kernel, templated on
// the Source that fills the stage), the resident grid. Their users: fp8_quantize_rows_and_columns's
// hot case (a stored BF16 tensor, every FP8 layer's output gradient; fp8_quantize.cu), the gathered
// operands of fp8_gather.cu (token rows through the routes, weighted in the stage) and the SwiGLU
// kernels that write only FP8 (fp8_swiglu_staged.cu, their own loop over the same halves). Include
// only from .cu files.
//
// Why staged: the one-block-per-tile kernel (fp8_tiles.cuh) gives each lane 4 rows x 32 bytes, so
// each of a warp's loads touches 32 rows' cache lines for 32 bytes each, and with the Rows output
// each block holds 64 values per lane in registers across a barrier; it ran at 1.9 TB/s where the
// Rows quantizer runs at 2.7 and a copy at 4.2. Here a block stays resident and loops over tiles:
// while it quantizes tile i out of one 32 KiB stage, tile i + 1 streams into the other with
// cp.async, 16 threads per 256-byte row (a warp's load covers two rows whole). Both outputs are
// made from the stage, each half reading it in the order that suits its stores (4 threads per row
// for the Rows tiles, 16 rows per lane for the columns), so no row amax table is needed.
// fp8_quantize_columns of a stored tensor keeps the one-block kernel: without the Rows output it
// was faster in the training step before the halves were rewritten (4.06 against 3.54 ms per step,
// bench/RESULTS.md, eighth session) and has not been measured against them since; the gathered
// columns alone (the expert input's) run staged: 0.557 -> 0.544 ms per layer (eighteenth session).
#pragma once

#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

#include "moe/ops/cuda/fp8_tiles.cuh"

namespace moe::cuda::fp8_tiles {

constexpr int kStageChunks = kTile * 2 / 16;                         // 16-byte chunks per BF16 tile row
constexpr int kStageWords = kTile * kStageChunks;                    // uint4 per stage (32 KiB)
constexpr size_t kStagedSharedBytes = 2 * kStageWords * sizeof(uint4);  // two stages

// A staged word's two BF16 values (the low half first), and two values rounded to BF16 as from_f32
// rounds, packed so.
__device__ __forceinline__ float bf16_low(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_high(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf16_half(uint32_t w, int h) { return h ? bf16_high(w) : bf16_low(w); }
__device__ __forceinline__ uint32_t bf16_pair(float low, float high) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(from_f32<__nv_bfloat16>(low))) |
         static_cast<uint32_t>(__bfloat16_as_ushort(from_f32<__nv_bfloat16>(high))) << 16;
}

// A chunk's place in a stage: row-major, the chunk index XOR-ed with bits 2..4 of the row. The copies
// (16 threads per row), the Rows half (a quarter-warp: 4 chunks each of rows r and r + 16) and the
// columns half (a half-warp: 32 bytes each of 4 rows differing in bits 3..4) all land on distinct
// banks under it.
__device__ __forceinline__ int stage_slot(int row, int chunk) {
  return row * kStageChunks + (chunk ^ ((row >> 2) & 7));
}

// One 16-byte cp.async into the shared address dst: from src when inside, else 16 zero bytes (source
// size 0: nothing is read).
__device__ __forceinline__ void copy_chunk_async(uint32_t dst, const void* src, bool inside) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(inside ? 16 : 0)
               : "memory");
}

// The chunks a thread copies into a stage: chunk column c = thread % 16 of rows r0 + kRowStep j, r0 =
// thread / 16 (kBlockThreads a multiple of 256, so kRowStep is a multiple of 16 rows). The slot of row
// r0 + kRowStep j is that of r0 plus a constant: the rows' distance, and the swizzle bits the step
// adds (stage_slot).
template <int kBlockThreads>
struct StageChunks {
  static_assert(kBlockThreads % (kStageChunks * 16) == 0 && kTile % (kBlockThreads / kStageChunks) == 0,
                "the row step must be a multiple of 16 rows (the swizzle's period) that divides the tile");
  static constexpr int kRowStep = kBlockThreads / kStageChunks, kSteps = kTile / kRowStep;
  int r0, c;
  uint32_t first_slot;  // shared address of row r0's chunk c
  __device__ __forceinline__ StageChunks(const uint4* stage, int thread)
      : r0(thread / kStageChunks),
        c(thread % kStageChunks),
        first_slot(static_cast<uint32_t>(__cvta_generic_to_shared(stage + stage_slot(r0, c)))) {}
  __device__ __forceinline__ int row(int j) const { return r0 + kRowStep * j; }
  __device__ __forceinline__ uint32_t slot(int j) const {
    const int delta = kRowStep * j * kStageChunks + ((c ^ ((row(j) >> 2) & 7)) - (c ^ ((r0 >> 2) & 7)));
    return first_slot + 16 * delta;
  }
};

// Starts copying x rows [tile.first_row, + tile.rows) x features [k0, k0 + 128) into `stage` (x's
// rows `stride` elements apart, K features each); the kBlockThreads threads of the block share the
// chunks, `thread` being the caller's index among them. Chunks past the rows or past K are
// zero-filled. A thread's source advances by a fixed step (StageChunks). NOTES: written with
// __pipeline_memcpy_async and the index arithmetic per chunk, each 16-byte chunk cost ~35
// instructions (64-bit address products, a branch, the intrinsic's zero-fill sequence; Nsight
// Compute SASS, 2026-12-04), a third of the staged quantizer's work.
template <int kBlockThreads = kThreads>
__device__ __forceinline__ void copy_tile_async(uint4* stage, const __nv_bfloat16* x, int64_t stride, int64_t K,
                                                TileRows tile, int64_t k0, int thread) {
  const StageChunks<kBlockThreads> chunks(stage, thread);
  const int64_t k = k0 + 8 * chunks.c;
  const bool inside_k = k < K;  // K % 8 == 0: a chunk is all in or all out
  const __nv_bfloat16* src = x + (tile.first_row + chunks.r0) * stride + k;
  const int64_t src_step = StageChunks<kBlockThreads>::kRowStep * stride;
#pragma unroll
  for (int j = 0; j < StageChunks<kBlockThreads>::kSteps; ++j) {
    const bool inside = inside_k && chunks.row(j) < tile.rows;
    copy_chunk_async(chunks.slot(j), inside ? src : x, inside);
    src += src_step;
  }
}

// cp.async.wait_group kPending: all the thread's own copies but the newest kPending groups have landed
// and are visible to it. Unlike __pipeline_wait_prior it is a compiler memory barrier too, so the
// thread's reads of its own chunks stay after it without a __syncthreads (a Source's prepare).
template <int kPending>
__device__ __forceinline__ void wait_own_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// The staged source of a stored BF16 tensor x [M, K].
struct StagedTensor {
  static constexpr bool kPrepares = false;
  struct Pending {};
  const __nv_bfloat16* x = nullptr;
  int64_t K = 0;
  __device__ __forceinline__ Pending copy(uint4* stage, TileRows tile, int64_t k0, int thread) const {
    copy_tile_async(stage, x, K, K, tile, k0, thread);
    return {};
  }
};

// The Rows tiles of the staged tile: 4 threads per row, thread q of a row taking its chunks q, q + 4,
// q + 8 and q + 12 (32 features), the row amax by 2 shuffles among the 4, 4 stores of 8 codes; each
// thread takes 2 rows. kThreads threads take the tile, `thread` (0 .. kThreads - 1, whole warps)
// being the caller's index among them. out.codes must be 8-byte aligned and K % 8 == 0
// (staged_source_fit).
//
// A warp's 8 rows of a step are r, r + 1, r + 2, r + 3 and r + 16 .. r + 19: the two rows of a
// quarter-warp differ in bit 4, so stage_slot's swizzle sends their 16-byte loads to different
// halves of the banks and a quarter-warp's 8 loads never conflict.
//
// NOTES: the form before this (16 threads per row, 8 features each) ran ~100 instructions per 8
// features (Nsight Compute SASS, 2026-12-04): the 4-shuffle amax, the scale and the address were
// paid per 8 features; here they are paid per 32.
__device__ __forceinline__ void store_staged_row_tiles(const uint4* stage, TileRows tile, int64_t k0, int64_t K,
                                                       const RowsOutput& out, int thread) {
  static_assert(kThreads == 256, "the row mapping below covers 128 rows with 8 warps");
  const int lane = thread & 31, warp = thread >> 5;
  const int q = lane & 3, pair = lane >> 2;
  const int64_t row_tiles = (K + kTile - 1) / kTile;
  const int first = 16 * (pair & 1) + (pair >> 1) + 4 * (warp & 3) + 32 * (warp >> 2);
#pragma unroll
  for (int step = 0; step < 2; ++step) {
    const int r = first + 64 * step;
    uint4 q4[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) q4[j] = stage[stage_slot(r, q + 4 * j)];
    constexpr uint32_t kMagnitudes = 0x7fff7fffu;  // two BF16 magnitudes, amax by max.u16x2
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      m = max_u16x2(m, max_u16x2(max_u16x2(q4[j].x & kMagnitudes, q4[j].y & kMagnitudes),
                                 max_u16x2(q4[j].z & kMagnitudes, q4[j].w & kMagnitudes)));
    m = max_u16x2(m, __shfl_xor_sync(kFullMask, m, 1));
    m = max_u16x2(m, __shfl_xor_sync(kFullMask, m, 2));
    if (r >= tile.rows) continue;  // after the shuffles: the 4 lanes of a row agree
    const float scale = fp8::tile_scale(__uint_as_float(max(m << 16, m & 0xffff0000u)));
    const int64_t row = tile.first_row + r;
    if (q == 0) out.scales[row * row_tiles + k0 / kTile] = scale;
    const TileQuantizer quantize(scale);
    uint8_t* codes = out.codes + row * K + k0 + 8 * q;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (k0 + 8 * (q + 4 * j) >= K) continue;  // K % 8 == 0: a chunk is all in or all out
      const uint32_t w[4] = {q4[j].x, q4[j].y, q4[j].z, q4[j].w};
      float v[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        v[2 * e] = __uint_as_float(w[e] << 16);
        v[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
      }
      *reinterpret_cast<uint2*>(codes + 32 * j) =
          make_uint2(quantize.word(v[0], v[1], v[2], v[3]), quantize.word(v[4], v[5], v[6], v[7]));
    }
  }
}

// The columns half of the staged tile: kThreads threads take it, `thread` (0 .. kThreads - 1, whole
// warps) being the caller's index among them; warp w = thread / 32 takes features k0 + 16 w .. + 15;
// lane l features 4 (l & 3) .. + 3 of those (8 bytes of a chunk) over 16 rows, the rows
// 8 (g & 3) + 32 (g >> 2) + {0 .. 7, 64 .. 71} of row group g = l >> 2. The column amax of a
// feature is a max over the lane's rows, then over the 8 row groups (3 shuffles per word of two
// features); the lane of row group f computes the scale of the run's feature f and hands its
// quantizer to the others. Each feature leaves as two 8-byte stores of 8 consecutive codes.
//
// The 16 lanes of a half-warp read 4 rows whose bits 3..4 differ: stage_slot's swizzle puts their
// 32-byte pieces in 4 different quarters of the banks, so the 8-byte loads never conflict.
//
// NOTES: the form before this (lane: 4 rows x 16 features; a shuffle, a 4-byte store and its
// address per feature and 4 rows) was shared with the one-block-per-tile kernel (store_column_tile);
// with the Rows half it ran ~35 instructions per element quantized (bench/RESULTS.md, seventeenth
// session). Here a lane's per-feature work is paid per 16 rows.
__device__ __forceinline__ void store_staged_column_tile(const uint4* stage, TileRows tile, int64_t column_tile,
                                                         int64_t k0, int64_t K, const ColumnsOutput& out, int thread) {
  const int lane = thread & 31, warp = thread >> 5, run = lane & 3, group = lane >> 2;
  const int chunk = 2 * warp + (run >> 1), half = run & 1;
  const int base = 8 * (group & 3) + 32 * (group >> 2);  // rows base + i (i < 8), base + 64 + i
  // Features 4 run .. + 3 of row r (two BF16 per word); read twice (the amax, then the codes), so
  // that only 8 rows' words are live at a time (the SwiGLU backward's 512-thread blocks have 64
  // registers).
  const auto words = [&](int r) { return reinterpret_cast<const uint2*>(stage + stage_slot(r, chunk))[half]; };
  constexpr uint32_t kMagnitudes = 0x7fff7fffu;
  uint32_t m[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const uint2 w = words(base + (i & 7) + 64 * (i >> 3));
    m[0] = max_u16x2(m[0], w.x & kMagnitudes);
    m[1] = max_u16x2(m[1], w.y & kMagnitudes);
  }
#pragma unroll
  for (int d = 4; d < 32; d <<= 1) {
    m[0] = max_u16x2(m[0], __shfl_xor_sync(kFullMask, m[0], d));
    m[1] = max_u16x2(m[1], __shfl_xor_sync(kFullMask, m[1], d));
  }
  // Row group f's lane: feature f of the run (f < 4; the other groups compute a spare).
  const int own = group & 3;
  const uint32_t pair = own < 2 ? m[0] : m[1];
  const float scale = fp8::tile_scale(__uint_as_float(own & 1 ? pair & 0xffff0000u : pair << 16));
  const float own_quantizer = TileQuantizer(scale).packed();
  const int64_t first_feature = k0 + 16 * warp + 4 * run;
  if (group < 4 && first_feature + own < K) *out.scale(first_feature + own, column_tile) = scale;

  const int64_t c0 = column_tile * kTile;
  const int width = static_cast<int>(min(out.Mp - c0, int64_t{kTile}));
  const int features = static_cast<int>(min(max(K - first_feature, int64_t{0}), int64_t{4}));
  uint8_t* codes = out.codes + first_feature * out.Mp + c0 + base;
#pragma unroll 1
  for (int h = 0; h < 2; ++h) {  // rows base + 64 h .. + 7
    const int r0 = base + 64 * h;
    uint2 w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = words(r0 + i);
    // Codes of rows past the segment (padding columns) are 0, even in a NaN tile.
    uint32_t rows_mask[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int inside = min(max(tile.rows - (r0 + 4 * k), 0), 4);
      rows_mask[k] = inside == 4 ? 0xffffffffu : (1u << (8 * inside)) - 1u;
    }
    const int valid = min(max(width - r0, 0), 8);
    uint8_t* next = codes + 64 * h;  // feature f's codes of these rows; Mp apart
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      const TileQuantizer quantize = TileQuantizer::unpack(__shfl_sync(kFullMask, own_quantizer, run + 4 * f));
      uint8_t* p = next;
      next += out.Mp;
      if (f >= features) continue;
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t word = f < 2 ? w[i].x : w[i].y;
        v[i] = __uint_as_float(f & 1 ? word & 0xffff0000u : word << 16);
      }
      const uint32_t lo = quantize.word(v[0], v[1], v[2], v[3]) & rows_mask[0];
      const uint32_t hi = quantize.word(v[4], v[5], v[6], v[7]) & rows_mask[1];
      if (out.pairs_ok && valid == 8) {
        *reinterpret_cast<uint2*>(p) = make_uint2(lo, hi);
      } else {
        for (int e = 0; e < valid; ++e) p[e] = static_cast<uint8_t>((e < 4 ? lo : hi) >> (8 * (e % 4)));
      }
    }
  }
}

// The staged quantizer of Source's values [M, K] (BF16): the columns codes and scales (out) and,
// with kRows, the Rows tiles (rows_out), in the segments of offsets. Resident blocks loop over the
// tiles t = blockIdx.x, + gridDim.x, ... (column tile t / feature_tiles, features k0 = 128 (t %
// feature_tiles) ..): while a block quantizes tile t out of one stage, its next tile streams into the
// other. Source::copy(stage, tile, k0, thread) starts a tile's cp.async copies and returns a
// Source::Pending, what the thread will need to prepare them (loads it started: they complete while
// the block quantizes the tile before); with Source::kPrepares, prepare(stage, pending, k0, thread)
// turns the thread's own landed chunks (those its copy started) into the values to quantize, in
// place (a Source without it needs no prepare). The Rows half ignores rows_out.vector:
// its 8-byte stores need only staged_source_fit's alignment. Dynamic shared memory: kStagedSharedBytes. (The name holds "quantize_columns":
// the step split times it as FP8 quantize, train/step_split.cpp.)
template <class Source, bool kRows>
__global__ void __launch_bounds__(kThreads, 3)
    quantize_columns_staged_kernel(Source src, const int32_t* offsets, int segments, int64_t M, int64_t K,
                                   int64_t feature_tiles, int64_t tile_count, ColumnsOutput out, RowsOutput rows_out) {
  extern __shared__ uint4 stages[];
  int64_t t = blockIdx.x;
  if (t >= tile_count) return;
  TileRows tile = find_tile_rows(offsets, segments, M, t / feature_tiles * kTile);
  const int thread = static_cast<int>(threadIdx.x);
  typename Source::Pending pending = src.copy(stages, tile, t % feature_tiles * kTile, thread);
  __pipeline_commit();
  for (int stage = 0; t < tile_count; t += gridDim.x, stage ^= 1) {
    const int64_t next = t + gridDim.x;
    TileRows next_tile{};
    typename Source::Pending next_pending{};
    if (next < tile_count) {
      next_tile = find_tile_rows(offsets, segments, M, next / feature_tiles * kTile);
      next_pending = src.copy(stages + (stage ^ 1) * kStageWords, next_tile, next % feature_tiles * kTile, thread);
    }
    __pipeline_commit();
    wait_own_copies<1>();  // this thread's copies of this tile are done (the next tile's may be in flight)
    uint4* current = stages + stage * kStageWords;
    const int64_t column_tile = t / feature_tiles, k0 = t % feature_tiles * kTile;
    // prepare touches only the chunks this thread copied, which the wait made visible to it, so it
    // runs before the barrier that publishes the stage: one barrier per tile, not two.
    if constexpr (Source::kPrepares) src.prepare(current, pending, k0, thread);
    __syncthreads();
    if constexpr (kRows) store_staged_row_tiles(current, tile, k0, K, rows_out, thread);
    store_staged_column_tile(current, tile, column_tile, k0, K, out, thread);
    __syncthreads();  // every thread is done with this stage before the next iteration refills it
    tile = next_tile;
    pending = next_pending;
  }
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

template <class Source, bool kRows>
void launch_staged_kernel(const Source& src, const Segments& segments, int64_t M, int64_t K, int64_t feature_tiles,
                          int64_t tile_count, const ColumnsOutput& columns, const RowsOutput& rows_out,
                          const char* op, cudaStream_t s) {
  constexpr auto kKernel = quantize_columns_staged_kernel<Source, kRows>;
  const int grid =
      static_cast<int>(std::min<int64_t>(resident_grid<kKernel>(kThreads, kStagedSharedBytes, op), tile_count));
  kKernel<<<grid, kThreads, kStagedSharedBytes, s>>>(src, segments.offsets, segments.count, M, K, feature_tiles,
                                                     tile_count, columns, rows_out);
  CUDA_CHECK_LAUNCH();
}

// The staged quantizer of src [M, K] into `out` (codes [K, Mp]) and, with `rows`, its Rows tiles.
// Needs K % 8 == 0, 16-byte aligned source rows (the Source's condition) and, with rows, 8-byte
// aligned Rows codes (staged_source_fit).
template <class Source>
void launch_columns_staged(const Fp8Tensor& out, const Source& src, const Tensor& offsets, int64_t M, int64_t K,
                           int64_t Mp, const Fp8Tensor* rows, const char* op, cudaStream_t s) {
  const Segments segments = segments_of(offsets);
  const int64_t feature_tiles = tiles(K), tile_count = tiles(Mp) * feature_tiles;
  const ColumnsOutput columns = columns_output(out, Mp);
  if (rows == nullptr)
    launch_staged_kernel<Source, false>(src, segments, M, K, feature_tiles, tile_count, columns, RowsOutput{}, op,
                                        s);
  else
    launch_staged_kernel<Source, true>(src, segments, M, K, feature_tiles, tile_count, columns,
                                       RowsOutput{rows->codes.ptr<uint8_t>(), rows->scales.ptr<float>(), true}, op, s);
}

// Whether the staged quantizer takes BF16 rows `x` (its 16-byte chunks aligned; K % 8 == 0) and,
// when given, the Rows output (8-byte aligned codes).
inline bool staged_source_fit(const Tensor& x, int64_t K, const Fp8Tensor* rows) {
  return x.dtype == DType::BF16 && K % 8 == 0 && aligned(x.data, 16) &&
         (rows == nullptr || aligned(rows->codes.data, 8));
}

}  // namespace moe::cuda::fp8_tiles

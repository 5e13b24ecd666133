// CUDA FP8 quantization (layouts: moe/ops/fp8.h; entry points: moe/ops/cuda/fp8.h). Every code and
// scale comes from moe/core/fp8.h's scalar functions (tile_scale, then quantize_with_scale with its
// per-tile part hoisted, see TileQuantizer), so the GPU writes the CPU's bits.
//
// A tile's amax is the unsigned maximum of |x|'s FP32 bits: non-negative floats order like their
// bits, and infinity (0x7f800000) and NaN (above it) rank above every finite value, so a tile
// holding either gets a non-finite amax and tile_scale gives it the NaN scale.
//
// Kernels (all memory-bound; none allocates, syncs with the host or reads device data on the host):
//   quantize_rows_kernel     1 x 128 tiles along rows: a group of lanes per tile, each lane 16
//                            bytes of input (4 F32 or 8 BF16; a warp covers 1 or 2 tiles per
//                            step, kUnroll steps' loads in flight), amax by shuffles, codes stored
//                            as 4- or 8-byte words. About 5 (F32) or 3 (BF16) bytes of traffic per
//                            element; expected near HBM bandwidth (~3.5-4 TB/s on an H200).
//   quantize_columns_kernel  one 256-thread block per (128 tokens of one segment) x (128
//                            features), each warp alone on 16 features (lane: 4 rows x 16
//                            features in registers, loaded up front): column amax by a halving
//                            exchange across the warp, codes stored as 4-byte words along the
//                            tokens (a feature's 128 codes leave as one coalesced 128-byte row).
//                            Each warp finds its segment itself from the device offsets (a warp
//                            scan of round_up(M_g, 128)), so no host copy, extra launch or barrier
//                            is needed. With the Rows output too (fp8_quantize_rows_and_columns),
//                            one barrier shares each row's amax across the 8 warps.
//   quantize_blocks_kernel   the same block shape over one 128 x 128 weight block: one amax, codes
//                            written from registers ([N, K]) and, when asked, transposed through
//                            shared memory ([K, N]). 1 read + 2 writes of a byte per F32 read.
//   dequantize_kernel        one thread per element (tests and checks; not a hot path).
// Measured on the H200 (MOE_BENCH=1 test_cuda_fp8, [16384, 2048] BF16): rows 2.5 TB/s; blocks (F32,
// both orientations) 3.0 TB/s.
#include "moe/ops/cuda/fp8.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "moe/core/cuda_check.h"
#include "moe/core/fp8.h"
#include "moe/ops/cuda/element.cuh"

namespace moe::cuda {
namespace {

constexpr int kTile = static_cast<int>(kFp8Tile);
constexpr int kThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ uint32_t magnitude_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

// fp8::e4m3_from_f32 for the finite values a tile quantizer converts (a tile holding a NaN or an
// infinity never reaches the conversion: its codes are all NaN). From SM89 on, the hardware
// conversion (cvt.rn.satfinite.e4m3x2.f32: round to nearest even, saturating to +-448) gives the
// same bits in one instruction where the portable function takes about twenty; the quantize
// kernels were bound by that arithmetic, not by memory. The bit-equality tests of
// tests/cuda/test_cuda_fp8.cpp compare every kernel's codes with the CPU's.
__device__ __forceinline__ uint8_t e4m3_code(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
#else
  return fp8::e4m3_from_f32(x);
#endif
}

// quantize_with_scale(x, scale) for every x of one tile, its per-tile part done once: the NaN test
// and 2^-k (k the scale's exponent). Same arithmetic, same bits.
struct TileQuantizer {
  float inverse = 1.0f;
  bool nan = false;
  __device__ __forceinline__ explicit TileQuantizer(float scale) {
    nan = !(scale == scale);
    if (!nan) inverse = fp8::pow2(-(static_cast<int>((fp8::float_bits(scale) >> 23) & 0xffu) - 127));
  }
  __device__ __forceinline__ uint8_t operator()(float x) const {
    return nan ? fp8::kE4m3NanCode : e4m3_code(x * inverse);
  }
};


template <typename T>
__device__ __forceinline__ void store_value(T* p, float v);
template <>
__device__ __forceinline__ void store_value<float>(float* p, float v) { *p = v; }
template <>
__device__ __forceinline__ void store_value<__nv_bfloat16>(__nv_bfloat16* p, float v) { *p = f32_to_bf16_bits(v); }

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// ---------------------------------------------------------------------------------------------
// Rows: 1 x 128 tiles.

constexpr int kRowsUnroll = 2;

template <typename T, int kVec>
__device__ __forceinline__ void load_run(const T* p, int valid, bool vector, float (&v)[kVec]) {
  if (vector && valid == kVec) {
    VecAccess<T, kVec>::unpack(VecAccess<T, kVec>::load(p), v);
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = e < valid ? to_f32(p[e]) : 0.0f;
  }
}

template <int kVec>
__device__ __forceinline__ void store_codes(uint8_t* p, int valid, bool vector, const uint8_t (&q)[kVec]) {
  if (vector && valid == kVec) {
    uint32_t w[kVec / 4];
#pragma unroll
    for (int j = 0; j < kVec / 4; ++j)
      w[j] = q[4 * j] | (q[4 * j + 1] << 8) | (q[4 * j + 2] << 16) | (static_cast<uint32_t>(q[4 * j + 3]) << 24);
    if constexpr (kVec == 4) {
      *reinterpret_cast<uint32_t*>(p) = w[0];
    } else {
      *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e)
      if (e < valid) p[e] = q[e];
  }
}

// x [rows, cols] -> codes [rows, cols], scales [rows, row_tiles]; vector: 16-byte loads and
// kVec-byte stores are aligned (cols % kVec == 0, aligned bases).
template <typename T>
__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(const T* x, uint8_t* codes, float* scales,
                                                                 int64_t rows, int64_t cols, int64_t row_tiles,
                                                                 bool vector) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per lane
  constexpr int kGroup = kTile / kVec;                    // lanes per tile: 32 (F32) or 16 (BF16)
  constexpr int kTilesPerWarp = 32 / kGroup;
  constexpr int kTilesPerStep = kTilesPerWarp * kRowsUnroll;
  const int lane = threadIdx.x & 31;
  const int member = lane % kGroup;
  const int64_t tiles = rows * row_tiles;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t first = warp * kTilesPerStep; first < tiles; first += warps * kTilesPerStep) {
    float v[kRowsUnroll][kVec];
    int64_t offset[kRowsUnroll];
    int valid[kRowsUnroll];
    // All loads first (kRowsUnroll runs of 16 bytes in flight per lane), then the reductions.
#pragma unroll
    for (int u = 0; u < kRowsUnroll; ++u) {
      const int64_t tile = first + u * kTilesPerWarp + lane / kGroup;
      offset[u] = 0;
      valid[u] = 0;
      if (tile < tiles) {
        const int64_t row = tile / row_tiles;
        const int64_t col = (tile - row * row_tiles) * kTile + member * kVec;
        offset[u] = row * cols + col;
        valid[u] = static_cast<int>(min(max(cols - col, int64_t{0}), int64_t{kVec}));
      }
      load_run<T, kVec>(x + offset[u], valid[u], vector, v[u]);
    }
#pragma unroll
    for (int u = 0; u < kRowsUnroll; ++u) {
      uint32_t amax = 0;
#pragma unroll
      for (int e = 0; e < kVec; ++e) amax = max(amax, magnitude_bits(v[u][e]));
#pragma unroll
      for (int d = kGroup / 2; d > 0; d >>= 1) amax = max(amax, __shfl_xor_sync(kFullMask, amax, d));
      const int64_t tile = first + u * kTilesPerWarp + lane / kGroup;
      if (tile >= tiles) continue;
      const float scale = fp8::tile_scale(__uint_as_float(amax));
      if (member == 0) scales[tile] = scale;  // scales [rows, row_tiles] row-major: index = tile
      const TileQuantizer quantize(scale);
      uint8_t q[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) q[e] = quantize(v[u][e]);
      store_codes<kVec>(codes + offset[u], valid[u], vector, q);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 128 x 128 tiles held by a 256-thread block (columns and blocks).
//
// Thread (warp w, lane l) holds rows 4 rq .. 4 rq + 3 with rq = l / 8 + 4 w, and for i = 0..3 the
// four columns 4 c .. 4 c + 3 with c = l % 8 + 8 i: v[i][s][e] is (row 4 rq + s, column 4 c + e).
// A warp's load for one (i, s) reads 4 rows x 8 runs of 4 consecutive columns.
// The transposed codes go through shared memory as words of 4 rows (one column): word
// (column, rq) at column * kStrideWords + rq; with 33 words per column, the 32 lanes of one store
// hit 32 different banks (4 (l % 8) + l / 8 + const, mod 32), and the read-out of a column's 32
// words is conflict-free as well.
constexpr int kStrideWords = kTile / 4 + 1;

struct TileThread {
  int lane = threadIdx.x & 31;
  int warp = threadIdx.x >> 5;
  int rq = lane / 8 + 4 * warp;
  __device__ __forceinline__ int column(int i) const { return 4 * (lane % 8 + 8 * i); }  // first of 4
};

// 4 consecutive F32 elements (vector: 16-byte aligned; valid: how many exist).
__device__ __forceinline__ void load4(const float* p, int valid, bool vector, float (&v)[4]) {
  if (vector && valid == 4) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    v[0] = f.x;
    v[1] = f.y;
    v[2] = f.z;
    v[3] = f.w;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = e < valid ? p[e] : 0.0f;
  }
}

// The thread's part of src[row0 + r, col0 + c] for r < rows_valid, c < cols_valid (zeros elsewhere).
__device__ __forceinline__ void load_tile(const float* src, int64_t ld, int64_t row0, int rows_valid, int64_t col0,
                                          int cols_valid, bool vector, const TileThread& t, float (&v)[4][4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int r = 4 * t.rq + s, c = t.column(i);
      const int valid = r < rows_valid ? min(max(cols_valid - c, 0), 4) : 0;
      const float* p = src + (row0 + r) * ld + col0 + c;
      load4(valid > 0 ? p : src, valid, vector, v[i][s]);
    }
  }
}

// Writes the transposed codes staged in `words` (column-major words of 4 rows) as rows of dst:
// dst[(row0 + c) * ld + col0 + r] for c < columns, r < width. word_ok: 4-byte stores are aligned.
__device__ __forceinline__ void write_transposed(const uint32_t* words, uint8_t* dst, int64_t ld, int64_t row0,
                                                 int columns, int64_t col0, int width, bool word_ok,
                                                 const TileThread& t) {
  for (int c = t.warp; c < columns; c += kThreads / 32) {
    const uint32_t w = words[c * kStrideWords + t.lane];
    uint8_t* p = dst + (row0 + c) * ld + col0 + 4 * t.lane;
    const int valid = min(max(width - 4 * t.lane, 0), 4);
    if (word_ok && valid == 4) {
      *reinterpret_cast<uint32_t*>(p) = w;
    } else {
      for (int e = 0; e < valid; ++e) p[e] = static_cast<uint8_t>(w >> (8 * e));
    }
  }
}

struct TileShared {
  uint32_t words[kTile * kStrideWords];     // transposed codes
  uint32_t partial[kThreads / 32];        // per-warp amax
};

// ---------------------------------------------------------------------------------------------
// Columns: x [M, K] -> codes [K, Mp], scales [K, ceil(Mp / 128)]; with kRows also the Rows tiles
// of the same rows, codes [M, K], scales [M, ceil(K / 128)].
//
// A block of 8 warps takes one column tile (128 rows of one segment) x 128 features; warp w takes
// features 16 w .. 16 w + 15 and lane l rows 4 l .. 4 l + 3, so every warp works alone (no shared
// memory, no barrier) except for the Rows output's row amax. Each lane's 4 x 16 values stay in
// registers (BF16 packed, 32 registers), loaded up front as 16-byte runs.

// The tile's rows: x rows [first_row, first_row + rows) (rows = 0: a padding tile).
struct TileRows {
  int64_t first_row = 0;
  int rows = 0;
};

// The x rows of the column tile whose first column is c0, to every lane of the calling warp. Segment
// g holds x rows [o_g, o_{g+1}) at columns [p_g, p_g + M_g), p_g = sum over g' < g of
// round_up(M_g', 128) (a warp scan over the segments). Offsets are clamped to [0, M] and made
// non-decreasing, so bad offsets give unspecified codes but never an out-of-bounds read.
// offsets == nullptr: one segment.
__device__ TileRows find_tile_rows(const int32_t* offsets, int segments, int64_t M, int64_t c0) {
  if (offsets == nullptr) return {c0, static_cast<int>(min(max(M - c0, int64_t{0}), int64_t{kTile}))};
  const int lane = threadIdx.x & 31;
  int64_t carry = 0;  // p_g of the chunk's first segment
  for (int g0 = 0; g0 < segments; g0 += 32) {
    const int g = g0 + lane;
    int64_t begin = 0, count = 0;
    if (g < segments) {
      begin = min(max(static_cast<int64_t>(offsets[g]), int64_t{0}), M);
      const int64_t end = min(max(static_cast<int64_t>(offsets[g + 1]), begin), M);
      count = end - begin;
    }
    const int64_t width = (count + kTile - 1) / kTile * kTile;
    int64_t inclusive = width;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int64_t below = __shfl_up_sync(kFullMask, inclusive, d);
      if (lane >= d) inclusive += below;
    }
    const int64_t start = carry + inclusive - width;
    const unsigned holder = __ballot_sync(kFullMask, g < segments && start <= c0 && c0 < start + width);
    if (holder != 0) {
      const int src = __ffs(holder) - 1;
      const int64_t first = __shfl_sync(kFullMask, begin + (c0 - start), src);
      const int64_t left = __shfl_sync(kFullMask, count - (c0 - start), src);
      return {first, static_cast<int>(min(left, int64_t{kTile}))};
    }
    carry += __shfl_sync(kFullMask, inclusive, 31);
  }
  return {};
}

constexpr int kRun = 16;  // features per warp

// 16 consecutive features of one row: BF16 packed in 8 words, F32 as 16 floats.
template <typename T>
struct Run16;
template <>
struct Run16<__nv_bfloat16> {
  uint32_t w[kRun / 2] = {};
  __device__ __forceinline__ float get(int f) const {
    return __uint_as_float(f % 2 ? w[f / 2] & 0xffff0000u : w[f / 2] << 16);
  }
  // vector: 16-byte aligned; valid: features present (0 reads nothing).
  __device__ __forceinline__ void load(const __nv_bfloat16* p, int valid, bool vector) {
    if (vector && valid == kRun) {
      const uint4 a = reinterpret_cast<const uint4*>(p)[0], b = reinterpret_cast<const uint4*>(p)[1];
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
      return;
    }
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
#pragma unroll
    for (int f = 0; f < kRun; ++f) {
      const uint32_t bits = f < valid ? h[f] : 0u;
      w[f / 2] |= f % 2 ? bits << 16 : bits;
    }
  }
};
template <>
struct Run16<float> {
  float v[kRun] = {};
  __device__ __forceinline__ float get(int f) const { return v[f]; }
  __device__ __forceinline__ void load(const float* p, int valid, bool vector) {
    if (vector && valid == kRun) {
#pragma unroll
      for (int j = 0; j < kRun / 4; ++j) {
        const float4 q = reinterpret_cast<const float4*>(p)[j];
        v[4 * j] = q.x, v[4 * j + 1] = q.y, v[4 * j + 2] = q.z, v[4 * j + 3] = q.w;
      }
      return;
    }
#pragma unroll
    for (int f = 0; f < kRun; ++f) v[f] = f < valid ? p[f] : 0.0f;
  }
};

// m[f]: a lane's amax of feature f. Returns the warp's amax of feature (lane >> 1) & 15: four halving
// exchanges (each lane keeps the half of the features its lane bit selects and takes the partner's
// maxima of it), then the last pair: 16 shuffles where 16 separate reductions take 80.
template <int kHalf, int kBit>
__device__ __forceinline__ void keep_half(uint32_t (&m)[kRun], int lane) {
  const bool upper = (lane & kBit) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const uint32_t keep = upper ? m[i + kHalf] : m[i], give = upper ? m[i] : m[i + kHalf];
    m[i] = max(keep, __shfl_xor_sync(kFullMask, give, kBit));
  }
}
__device__ __forceinline__ uint32_t warp_feature_amax(uint32_t (&m)[kRun], int lane) {
  keep_half<8, 16>(m, lane);
  keep_half<4, 8>(m, lane);
  keep_half<2, 4>(m, lane);
  keep_half<1, 2>(m, lane);
  return max(m[0], __shfl_xor_sync(kFullMask, m[0], 1));
}

// The Rows-tile output (kRows): codes [M, K], scales [M, ceil(K / 128)].
struct RowsOutput {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  bool vector = false;  // 16-byte code stores are aligned (K % 16 == 0, aligned base)
};

template <typename T, bool kRows>
__global__ void __launch_bounds__(kThreads, 3)
    quantize_columns_kernel(const T* x, const int32_t* offsets, int segments, uint8_t* codes, float* scales,
                            int64_t M, int64_t K, int64_t Mp, int64_t feature_tiles, bool vector, bool word_ok,
                            RowsOutput rows_out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t column_tile = blockIdx.x / feature_tiles;
  const int64_t c0 = column_tile * kTile;                         // first column of codes
  const int64_t k0 = (blockIdx.x % feature_tiles) * kTile;       // the block's first feature
  const int64_t kw = k0 + kRun * warp;                           // the warp's first feature
  const int features = static_cast<int>(min(max(K - kw, int64_t{0}), int64_t{kRun}));
  const int width = static_cast<int>(min(Mp - c0, int64_t{kTile}));
  const TileRows tile = find_tile_rows(offsets, segments, M, c0);

  Run16<T> run[4];
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const int r = 4 * lane + s;
    if (r < tile.rows) run[s].load(x + (tile.first_row + r) * K + kw, features, vector);
  }

  if constexpr (kRows) {
    // Each row's amax over the block's 128 features: the lane's 16, then the 8 warps.
    __shared__ uint32_t row_amax[kThreads / 32][kTile];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t m = 0;
#pragma unroll
      for (int f = 0; f < kRun; ++f) m = max(m, magnitude_bits(run[s].get(f)));
      row_amax[warp][4 * lane + s] = m;
    }
    __syncthreads();
    const int64_t row_tiles = (K + kTile - 1) / kTile;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int r = 4 * lane + s;
      if (r >= tile.rows || features == 0) continue;
      uint32_t m = 0;
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) m = max(m, row_amax[w][r]);
      const float scale = fp8::tile_scale(__uint_as_float(m));
      const int64_t row = tile.first_row + r;
      if (warp == 0) rows_out.scales[row * row_tiles + k0 / kTile] = scale;
      const TileQuantizer quantize(scale);
      uint32_t words[kRun / 4];
#pragma unroll
      for (int j = 0; j < kRun / 4; ++j) {
        words[j] = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) words[j] |= static_cast<uint32_t>(quantize(run[s].get(4 * j + e))) << (8 * e);
      }
      uint8_t* p = rows_out.codes + row * K + kw;
      if (rows_out.vector && features == kRun) {
        *reinterpret_cast<uint4*>(p) = make_uint4(words[0], words[1], words[2], words[3]);
      } else {
#pragma unroll
        for (int f = 0; f < kRun; ++f)
          if (f < features) p[f] = static_cast<uint8_t>(words[f / 4] >> (8 * (f % 4)));
      }
    }
  }

  // Column amax of each feature (warp-wide), its scale, then 4 codes (4 rows) per lane and feature.
  uint32_t m[kRun];
#pragma unroll
  for (int f = 0; f < kRun; ++f) {
    m[f] = 0;
#pragma unroll
    for (int s = 0; s < 4; ++s) m[f] = max(m[f], magnitude_bits(run[s].get(f)));
  }
  const float scale = fp8::tile_scale(__uint_as_float(warp_feature_amax(m, lane)));  // feature (lane >> 1) & 15
  const int own = (lane >> 1) & 15;
  // Padding tiles (no rows) get tile_scale(0) = 1, as the CPU writes them.
  if (lane % 2 == 0 && own < features) scales[(kw + own) * ((Mp + kTile - 1) / kTile) + column_tile] = scale;
  const int valid = min(max(width - 4 * lane, 0), 4);
#pragma unroll
  for (int f = 0; f < kRun; ++f) {
    const TileQuantizer quantize(__shfl_sync(kFullMask, scale, 2 * f));
    if (f >= features) continue;
    // Codes of rows past the segment (padding columns) are 0, even in a NaN tile.
    uint32_t word = 0;
#pragma unroll
    for (int s = 0; s < 4; ++s)
      if (4 * lane + s < tile.rows) word |= static_cast<uint32_t>(quantize(run[s].get(f))) << (8 * s);
    uint8_t* p = codes + (kw + f) * Mp + c0 + 4 * lane;
    if (word_ok && valid == 4) {
      *reinterpret_cast<uint32_t*>(p) = word;
    } else {
      for (int e = 0; e < valid; ++e) p[e] = static_cast<uint8_t>(word >> (8 * e));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Blocks: w [E, N, K] -> codes [E, N, K], scales [E, ceil(N/128), ceil(K/128)], and optionally
// codes_t [E, K, N], scales_t [E, ceil(K/128), ceil(N/128)].

__global__ void __launch_bounds__(kThreads, 2)
    quantize_blocks_kernel(const float* w, uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                           int64_t N, int64_t K, int64_t n_tiles, int64_t k_tiles, bool vector, bool word_ok,
                           bool word_ok_t) {
  __shared__ TileShared sh;
  const TileThread t;
  const int64_t e = blockIdx.x / (n_tiles * k_tiles);
  const int64_t bi = (blockIdx.x / k_tiles) % n_tiles, bj = blockIdx.x % k_tiles;
  const int64_t n0 = bi * kTile, k0 = bj * kTile;
  const int rows = static_cast<int>(min(N - n0, int64_t{kTile}));
  const int cols = static_cast<int>(min(K - k0, int64_t{kTile}));
  const float* src = w + e * N * K;

  float v[4][4][4];
  load_tile(src, K, n0, rows, k0, cols, vector, t, v);

  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int x = 0; x < 4; ++x) m = max(m, magnitude_bits(v[i][s][x]));
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) m = max(m, __shfl_xor_sync(kFullMask, m, d));
  if (t.lane == 0) sh.partial[t.warp] = m;
  __syncthreads();
  m = 0;
#pragma unroll
  for (int ww = 0; ww < kThreads / 32; ++ww) m = max(m, sh.partial[ww]);
  const float scale = fp8::tile_scale(__uint_as_float(m));
  if (threadIdx.x == 0) {
    scales[(e * n_tiles + bi) * k_tiles + bj] = scale;
    if (scales_t != nullptr) scales_t[(e * k_tiles + bj) * n_tiles + bi] = scale;
  }
  const TileQuantizer quantize(scale);

  uint8_t* dst = codes + e * N * K;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t column_words[4] = {0, 0, 0, 0};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int r = 4 * t.rq + s, c = t.column(i);
      uint8_t q[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        q[x] = quantize(v[i][s][x]);
        column_words[x] |= static_cast<uint32_t>(q[x]) << (8 * s);
      }
      if (r < rows) {
        const int valid = min(max(cols - c, 0), 4);
        uint8_t* p = dst + (n0 + r) * K + k0 + c;
        if (word_ok && valid == 4) {
          *reinterpret_cast<uint32_t*>(p) = q[0] | (q[1] << 8) | (q[2] << 16) | (static_cast<uint32_t>(q[3]) << 24);
        } else {
          for (int x = 0; x < valid; ++x) p[x] = q[x];
        }
      }
    }
    if (codes_t != nullptr) {
#pragma unroll
      for (int x = 0; x < 4; ++x) sh.words[(t.column(i) + x) * kStrideWords + t.rq] = column_words[x];
    }
  }
  if (codes_t == nullptr) return;
  __syncthreads();
  write_transposed(sh.words, codes_t + e * K * N, N, k0, cols, n0, rows, word_ok_t, t);
}

// ---------------------------------------------------------------------------------------------
// Dequantize: out [batches, R, C] = e4m3(code) * scale; tile_rows 1 (Rows) or 128 (Blocks).

template <typename T>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(T* out, const uint8_t* codes, const float* scales,
                                                              int64_t total, int64_t R, int64_t C, int tile_rows) {
  const int64_t col_tiles = (C + kTile - 1) / kTile;
  const int64_t row_tiles = (R + tile_rows - 1) / tile_rows;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / C, c = i - row * C;
    const int64_t b = row / R, r = row - b * R;
    const float scale = scales[(b * row_tiles + r / tile_rows) * col_tiles + c / kTile];
    store_value<T>(out + i, fp8::e4m3_to_f32(codes[i]) * scale);
  }
}

// Rows of a tensor with every dim but the last folded in.
int64_t folded_rows(const Tensor& t) {
  int64_t rows = 1;
  for (int i = 0; i + 1 < t.ndim(); ++i) rows *= t.dim(i);
  return rows;
}

int64_t tiles(int64_t n) { return (n + kTile - 1) / kTile; }

template <typename T>
void launch_quantize_rows(const Fp8Tensor& out, const Tensor& x, int64_t rows, int64_t cols, cudaStream_t s) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const bool vector = cols % kVec == 0 && aligned(x.data, 16) && aligned(out.codes.data, kVec);
  const int64_t row_tiles = tiles(cols);
  const int64_t tiles_per_step = (32 / (kTile / kVec)) * kRowsUnroll;
  const int64_t warps = (rows * row_tiles + tiles_per_step - 1) / tiles_per_step;
  quantize_rows_kernel<T><<<grid_stride_blocks(warps * 32, kThreads), kThreads, 0, s>>>(
      x.ptr<const T>(), out.codes.ptr<uint8_t>(), out.scales.ptr<float>(), rows, cols, row_tiles, vector);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_quantize_columns(const Fp8Tensor& out, const Tensor& x, const Tensor& offsets, int64_t M, int64_t K,
                             int64_t Mp, const Fp8Tensor* rows, cudaStream_t s) {
  const bool one_segment = offsets.empty() || offsets.numel() == 0;
  const int segments = one_segment ? 1 : static_cast<int>(offsets.numel() - 1);
  // 16-byte loads of a warp's 16-feature runs: every row start aligned.
  const bool vector = K % (16 / sizeof(T)) == 0 && aligned(x.data, 16);
  const bool word_ok = Mp % 4 == 0 && aligned(out.codes.data, 4);
  const int64_t feature_tiles = tiles(K), blocks = tiles(Mp) * feature_tiles;
  MOE_CHECK(blocks <= 2147483647, "fp8_quantize_columns: ", blocks, " tiles exceed one launch");
  const int32_t* segment_offsets = one_segment ? nullptr : offsets.ptr<const int32_t>();
  if (rows == nullptr) {
    quantize_columns_kernel<T, false><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
        x.ptr<const T>(), segment_offsets, segments, out.codes.ptr<uint8_t>(), out.scales.ptr<float>(), M, K, Mp,
        feature_tiles, vector, word_ok, RowsOutput{});
  } else {
    const RowsOutput rows_out{rows->codes.ptr<uint8_t>(), rows->scales.ptr<float>(),
                              K % 16 == 0 && aligned(rows->codes.data, 16)};
    quantize_columns_kernel<T, true><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
        x.ptr<const T>(), segment_offsets, segments, out.codes.ptr<uint8_t>(), out.scales.ptr<float>(), M, K, Mp,
        feature_tiles, vector, word_ok, rows_out);
  }
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_dequantize(const Tensor& out, const Fp8Tensor& in, cudaStream_t s) {
  const int64_t total = in.codes.numel();
  const int64_t C = in.codes.dim(-1);
  const int64_t R = in.tiles == Fp8Tiles::Blocks ? in.codes.dim(-2) : folded_rows(in.codes);
  dequantize_kernel<T><<<grid_stride_blocks(total, kThreads), kThreads, 0, s>>>(
      out.ptr<T>(), in.codes.ptr<const uint8_t>(), in.scales.ptr<const float>(), total, R, C,
      in.tiles == Fp8Tiles::Blocks ? kTile : 1);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void fp8_quantize_rows(Fp8Tensor out, Tensor x, Stream stream) {
  const int64_t rows = folded_rows(x), cols = x.dim(-1);
  if (rows == 0 || cols == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (x.dtype == DType::BF16)
    launch_quantize_rows<__nv_bfloat16>(out, x, rows, cols, s);
  else
    launch_quantize_rows<float>(out, x, rows, cols, s);
}

void fp8_quantize_columns(Fp8Tensor out, Tensor x, Tensor offsets, Stream stream) {
  const int64_t M = folded_rows(x), K = x.dim(-1), Mp = out.codes.dim(-1);
  if (K == 0 || Mp == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (x.dtype == DType::BF16)
    launch_quantize_columns<__nv_bfloat16>(out, x, offsets, M, K, Mp, nullptr, s);
  else
    launch_quantize_columns<float>(out, x, offsets, M, K, Mp, nullptr, s);
}

void fp8_quantize_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, Tensor x, Tensor offsets, Stream stream) {
  const int64_t M = folded_rows(x), K = x.dim(-1), Mp = columns.codes.dim(-1);
  if (K == 0 || Mp == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (x.dtype == DType::BF16)
    launch_quantize_columns<__nv_bfloat16>(columns, x, offsets, M, K, Mp, &rows, s);
  else
    launch_quantize_columns<float>(columns, x, offsets, M, K, Mp, &rows, s);
}

void fp8_quantize_blocks(Fp8Tensor out, Fp8Tensor out_t, Tensor w, Stream stream) {
  const int64_t N = w.dim(-2), K = w.dim(-1);
  int64_t E = 1;  // experts: every dim before the last two
  for (int i = 0; i + 2 < w.ndim(); ++i) E *= w.dim(i);
  if (E == 0 || N == 0 || K == 0) return;
  const bool transposed = !out_t.codes.empty();
  const int64_t n_tiles = tiles(N), k_tiles = tiles(K), blocks = E * n_tiles * k_tiles;
  MOE_CHECK(blocks <= 2147483647, "fp8_quantize_blocks: ", blocks, " blocks exceed one launch");
  const bool vector = K % 4 == 0 && aligned(w.data, 16);
  const bool word_ok = K % 4 == 0 && aligned(out.codes.data, 4);
  const bool word_ok_t = transposed && N % 4 == 0 && aligned(out_t.codes.data, 4);
  quantize_blocks_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, cuda_stream(stream)>>>(
      w.ptr<const float>(), out.codes.ptr<uint8_t>(), out.scales.ptr<float>(),
      transposed ? out_t.codes.ptr<uint8_t>() : nullptr, transposed ? out_t.scales.ptr<float>() : nullptr, N, K,
      n_tiles, k_tiles, vector, word_ok, word_ok_t);
  CUDA_CHECK_LAUNCH();
}

void fp8_dequantize(Tensor out, Fp8Tensor in, Stream stream) {
  if (in.codes.numel() == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (out.dtype == DType::BF16)
    launch_dequantize<__nv_bfloat16>(out, in, s);
  else
    launch_dequantize<float>(out, in, s);
}

}  // namespace moe::cuda

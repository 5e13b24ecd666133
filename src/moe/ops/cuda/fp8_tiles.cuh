// The FP8 tile quantizers shared by the quantize kernels (fp8_quantize.cu) and the kernels that
// quantize what they produce (fp8_swiglu.cu): the Rows kernel (1 x 128 tiles) and the columns kernel
// (Columns tiles: 1 x 128 along the tokens, optionally with the Rows tiles of the same values in one pass), both
// templated on a Source that produces the values to quantize. A Source is what makes a producer
// kernel out of a quantizer: TensorRows / TensorColumns read a tensor; a fused producer computes its
// values (rounded to its output type, so the codes are those of quantizing its stored output) and may
// store them too. Layouts: moe/ops/fp8.h; the kernels' design notes: fp8_quantize.cu.
// Include only from .cu files (kernel templates and device code).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "moe/core/cuda_check.h"
#include "moe/core/fp8.h"
#include "moe/ops/cuda/element.cuh"
#include "moe/ops/fp8.h"

namespace moe::cuda::fp8_tiles {

constexpr int kTile = static_cast<int>(kFp8Tile);
constexpr int kThreads = 256;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ uint32_t magnitude_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

// fp8::e4m3_from_f32 of two values, lo in the low byte, for the finite values a tile quantizer
// converts (a tile holding a NaN or an infinity never reaches the conversion: its codes are all
// NaN). From SM89 on, the hardware conversion (cvt.rn.satfinite.e4m3x2.f32: round to nearest
// even, saturating to +-448) gives the same bits in one instruction for the pair where the
// portable function takes about twenty per value. It converts pairs: one value at a time spends an
// instruction on a zero partner and more on moving bytes, and the quantizers were bound by
// instruction issue, not by memory (ncu, 2026-12-02). The bit-equality tests of
// tests/cuda/test_cuda_fp8.cpp compare every kernel's codes with the CPU's.
__device__ __forceinline__ uint32_t e4m3x2_code(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
#else
  return fp8::e4m3_from_f32(lo) | static_cast<uint32_t>(fp8::e4m3_from_f32(hi)) << 8;
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
  // The quantizer as one float for handing between lanes (the inverse, NaN for a NaN tile) and back:
  // a shuffle of it replaces each receiving lane's exponent arithmetic.
  __device__ __forceinline__ float packed() const { return nan ? __uint_as_float(0x7fc00000u) : inverse; }
  __device__ __forceinline__ static TileQuantizer unpack(float packed) {
    TileQuantizer q(1.0f);
    q.nan = !(packed == packed);
    q.inverse = packed;
    return q;
  }
  // The codes of a, b, c, d packed in a word, a in the low byte (a NaN tile's: all NaN codes).
  // Converted always and then selected, not branched around: a branch per word cost a BSSY/BSYNC
  // pair, a compare and a jump per 4 values (Nsight Compute, 2026-12-04), as much as converting.
  __device__ __forceinline__ uint32_t word(float a, float b, float c, float d) const {
    constexpr uint32_t kNanWord = 0x01010101u * fp8::kE4m3NanCode;
    const uint32_t codes = e4m3x2_code(a * inverse, b * inverse) | e4m3x2_code(c * inverse, d * inverse) << 16;
    return nan ? kNanWord : codes;
  }
};

inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

inline int64_t tiles(int64_t n) { return (n + kTile - 1) / kTile; }

// n / d for 0 <= n < 2^31 by a multiply-high and a shift (Granlund and Montgomery; the remainder is
// n - quotient * d), d fixed per launch: the Rows kernel maps each tile index to its row and tile column, and a 64-bit
// division there cost as many instructions as quantizing the tile's values.
struct FastDivmod {
  uint32_t d = 1, mul = 0, shift = 0;
  FastDivmod() = default;
  explicit FastDivmod(uint32_t divisor) : d(divisor) {
    if (d <= 1) return;
    uint32_t log2_ceil = 0;
    while ((uint64_t{1} << log2_ceil) < d) ++log2_ceil;
    mul = static_cast<uint32_t>(((uint64_t{1} << (31 + log2_ceil)) + d - 1) / d);
    shift = log2_ceil - 1;
  }
  __device__ __forceinline__ uint32_t quotient(uint32_t n) const { return d == 1 ? n : __umulhi(n, mul) >> shift; }
};

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

// kVec codes packed in words (4 per word, the first in the low byte) -> p; valid: how many to store.
template <int kVec>
__device__ __forceinline__ void store_codes(uint8_t* p, int valid, bool vector, const uint32_t (&w)[kVec / 4]) {
  if (vector && valid == kVec) {
    if constexpr (kVec == 4) {
      *reinterpret_cast<uint32_t*>(p) = w[0];
    } else {
      *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e)
      if (e < valid) p[e] = static_cast<uint8_t>(w[e / 4] >> (8 * (e % 4)));
  }
}

// The Rows kernel's source of a plain tensor x [rows, cols]: load gives the kVec values of row `row`
// from column `col` on, `valid` of them (the rest 0); vector: one aligned 16-byte load.
template <typename T>
struct TensorRows {
  const T* x = nullptr;
  int64_t cols = 0;
  template <int kVec>
  __device__ __forceinline__ void load(int64_t row, int64_t col, int valid, bool vector, float (&v)[kVec]) const {
    load_run<T, kVec>(x + row * cols + col, valid, vector, v);
  }
};

// The values of src [rows, cols] (T: their element type, 16 bytes = kVec of them per lane) ->
// codes [rows, cols], scales [rows, row_tiles]; vector: the source's 16-byte accesses and the
// kVec-byte code stores are aligned (cols % kVec == 0, aligned bases).
template <typename T, class Source>
__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(Source src, uint8_t* codes, float* scales,
                                                                 int64_t cols, FastDivmod row_tiles,
                                                                 int32_t tiles, bool vector) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));  // elements per lane
  constexpr int kGroup = kTile / kVec;                    // lanes per tile: 32 (F32) or 16 (BF16)
  constexpr int kTilesPerWarp = 32 / kGroup;
  constexpr int kTilesPerStep = kTilesPerWarp * kRowsUnroll;
  const int lane = threadIdx.x & 31;
  const int member = lane % kGroup;
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
      int64_t row = 0, col = 0;
      valid[u] = 0;
      if (tile < tiles) {
        row = row_tiles.quotient(static_cast<uint32_t>(tile));
        col = (tile - row * row_tiles.d) * kTile + member * kVec;
        valid[u] = static_cast<int>(min(max(cols - col, int64_t{0}), int64_t{kVec}));
      }
      offset[u] = row * cols + col;
      src.template load<kVec>(row, col, valid[u], vector, v[u]);
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
      uint32_t q[kVec / 4];
#pragma unroll
      for (int j = 0; j < kVec / 4; ++j)
        q[j] = quantize.word(v[u][4 * j], v[u][4 * j + 1], v[u][4 * j + 2], v[u][4 * j + 3]);
      store_codes<kVec>(codes + offset[u], valid[u], vector, q);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Columns: x [M, K] -> codes [K, Mp], scales [ceil(Mp / 128), K]; with kRows also the Rows tiles
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
__device__ inline TileRows find_tile_rows(const int32_t* offsets, int segments, int64_t M, int64_t c0) {
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
  // Feature f = v rounded to BF16 as from_f32 rounds (each f set once, on a run constructed empty).
  __device__ __forceinline__ void set(int f, float v) {
    const uint32_t bits = __bfloat16_as_ushort(from_f32<__nv_bfloat16>(v));
    w[f / 2] |= f % 2 ? bits << 16 : bits;
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
  __device__ __forceinline__ void set(int f, float x) { v[f] = x; }
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

// Per-halfword unsigned maximum: the magnitudes of two packed BF16 values order like their bits
// (as FP32's do), so one instruction takes the amax of two values (PTX max.u16x2 from SM90 on).
__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t r;
  asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  return __vmaxu2(a, b);
#endif
}

struct MaxU32 {
  __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const { return max(a, b); }
};
struct MaxU16x2 {
  __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const { return max_u16x2(a, b); }
};

// One halving exchange of per-lane maxima m[0 .. 2 kHalf): each lane keeps the half its lane bit kBit
// selects and takes the partner's maxima of it (into m[0 .. kHalf)).
template <int kHalf, int kBit, class Max, int N>
__device__ __forceinline__ void keep_half(uint32_t (&m)[N], int lane, Max combine) {
  const bool upper = (lane & kBit) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const uint32_t keep = upper ? m[i + kHalf] : m[i], give = upper ? m[i] : m[i + kHalf];
    m[i] = combine(keep, __shfl_xor_sync(kFullMask, give, kBit));
  }
}

// The warp's amax (as FP32 bits) of feature (lane >> 1) & 15 over every lane's run[0..3], by halving
// exchanges then the last lane pairs: 16 shuffles where 16 separate reductions take 80. BF16 keeps
// two features per word throughout (max.u16x2 on the magnitudes): 9 shuffles, and a quarter of the
// comparisons.
__device__ __forceinline__ uint32_t column_amax(const Run16<float> (&run)[4], int lane) {
  uint32_t m[kRun];
#pragma unroll
  for (int f = 0; f < kRun; ++f) {
    m[f] = 0;
#pragma unroll
    for (int s = 0; s < 4; ++s) m[f] = max(m[f], magnitude_bits(run[s].get(f)));
  }
  keep_half<8, 16>(m, lane, MaxU32{});
  keep_half<4, 8>(m, lane, MaxU32{});
  keep_half<2, 4>(m, lane, MaxU32{});
  keep_half<1, 2>(m, lane, MaxU32{});
  return max(m[0], __shfl_xor_sync(kFullMask, m[0], 1));
}
__device__ __forceinline__ uint32_t column_amax(const Run16<__nv_bfloat16> (&run)[4], int lane) {
  constexpr uint32_t kMagnitudes = 0x7fff7fffu;
  uint32_t m[kRun / 2];  // features 2 j (low half) and 2 j + 1 (high half)
#pragma unroll
  for (int j = 0; j < kRun / 2; ++j)
    m[j] = max_u16x2(max_u16x2(run[0].w[j] & kMagnitudes, run[1].w[j] & kMagnitudes),
                     max_u16x2(run[2].w[j] & kMagnitudes, run[3].w[j] & kMagnitudes));
  keep_half<4, 16>(m, lane, MaxU16x2{});  // lane keeps word (lane >> 2) & 7: features 2 ((lane >> 2) & 7) + {0, 1}
  keep_half<2, 8>(m, lane, MaxU16x2{});
  keep_half<1, 4>(m, lane, MaxU16x2{});
  m[0] = max_u16x2(m[0], __shfl_xor_sync(kFullMask, m[0], 2));
  m[0] = max_u16x2(m[0], __shfl_xor_sync(kFullMask, m[0], 1));
  return lane & 2 ? m[0] & 0xffff0000u : m[0] << 16;  // feature 2 ((lane >> 2) & 7) + ((lane >> 1) & 1)
}

// The Rows-tile output (kRows): codes [M, K], scales [M, ceil(K / 128)].
struct RowsOutput {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  bool vector = false;  // 16-byte code stores are aligned (K % 16 == 0, aligned base)
};

// The columns kernel's source of a plain tensor x [M, K]: load fills `run` with features
// kw .. kw + features - 1 of row `row` (vector: two aligned 16-byte loads when features == 16).
template <typename T>
struct TensorColumns {
  const T* x = nullptr;
  int64_t K = 0;
  __device__ __forceinline__ void load(Run16<T>& run, int64_t row, int64_t kw, int features, bool vector) const {
    run.load(x + row * K + kw, features, vector);
  }
};

// Where the columns quantizers write: codes [K, Mp], scales [ceil(Mp / 128), K] (Columns tiles,
// tile-major); word_ok: 4-byte code stores are aligned (Mp % 4 == 0, aligned base); pairs_ok: 8-byte
// ones (Mp % 8 == 0).
struct ColumnsOutput {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  int64_t Mp = 0;
  int64_t features = 0;  // K
  bool word_ok = false;
  bool pairs_ok = false;
  __device__ __forceinline__ float* scale(int64_t feature, int64_t column_tile) const {
    return scales + column_tile * features + feature;
  }
};

// The columns half of a column tile, shared by both columns kernels: the lane's run[s] holds
// features kw .. kw + features - 1 of tile row 4 lane + s (zero past the tile's rows). Column amax of
// each feature (warp-wide), its scale, then 4 codes (4 rows) per lane and feature.
template <typename T>
__device__ __forceinline__ void store_column_tile(const Run16<T> (&run)[4], const ColumnsOutput& out,
                                                  int64_t column_tile, int64_t kw, int features, int tile_rows) {
  const int lane = threadIdx.x & 31;
  const int64_t c0 = column_tile * kTile;
  const int width = static_cast<int>(min(out.Mp - c0, int64_t{kTile}));
  const float scale = fp8::tile_scale(__uint_as_float(column_amax(run, lane)));  // feature (lane >> 1) & 15
  const float own_quantizer = TileQuantizer(scale).packed();
  const int own = (lane >> 1) & 15;
  // Padding tiles (no rows) get tile_scale(0) = 1, as the CPU writes them.
  if (lane % 2 == 0 && own < features) *out.scale(kw + own, column_tile) = scale;
  const int valid = min(max(width - 4 * lane, 0), 4);
  const int own_rows = min(max(tile_rows - 4 * lane, 0), 4);  // this lane's 4 rows inside the segment
  const uint32_t own_rows_mask = own_rows == 4 ? 0xffffffffu : (1u << (8 * own_rows)) - 1u;
#pragma unroll
  for (int f = 0; f < kRun; ++f) {
    const TileQuantizer quantize = TileQuantizer::unpack(__shfl_sync(kFullMask, own_quantizer, 2 * f));
    if (f >= features) continue;
    // Codes of rows past the segment (padding columns) are 0, even in a NaN tile.
    const uint32_t word =
        quantize.word(run[0].get(f), run[1].get(f), run[2].get(f), run[3].get(f)) & own_rows_mask;
    uint8_t* p = out.codes + (kw + f) * out.Mp + c0 + 4 * lane;
    if (out.word_ok && valid == 4) {
      *reinterpret_cast<uint32_t*>(p) = word;
    } else {
      for (int e = 0; e < valid; ++e) p[e] = static_cast<uint8_t>(word >> (8 * e));
    }
  }
}

// The values of src [M, K] (T: their element type) -> columns codes [K, Mp] and scales, and with
// kRows the Rows tiles of the same values into rows_out. Only rows inside a segment are loaded.
template <typename T, bool kRows, class Source>
__global__ void __launch_bounds__(kThreads, 3)
    quantize_columns_kernel(Source src, const int32_t* offsets, int segments, int64_t M, int64_t K,
                            int64_t feature_tiles, bool vector, ColumnsOutput out, RowsOutput rows_out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t column_tile = blockIdx.x / feature_tiles;
  const int64_t k0 = (blockIdx.x % feature_tiles) * kTile;  // the block's first feature
  const int64_t kw = k0 + kRun * warp;                      // the warp's first feature
  const int features = static_cast<int>(min(max(K - kw, int64_t{0}), int64_t{kRun}));
  const TileRows tile = find_tile_rows(offsets, segments, M, column_tile * kTile);

  Run16<T> run[4];
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const int r = 4 * lane + s;
    if (r < tile.rows) src.load(run[s], tile.first_row + r, kw, features, vector);
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
      for (int j = 0; j < kRun / 4; ++j)
        words[j] =
            quantize.word(run[s].get(4 * j), run[s].get(4 * j + 1), run[s].get(4 * j + 2), run[s].get(4 * j + 3));
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
  store_column_tile(run, out, column_tile, kw, features, tile.rows);
}

// Quantizes the values of src [rows, cols] (element type T) into Rows tiles `out`. src_vector: the
// source's 16-byte accesses are aligned (its own condition; the codes' alignment is added here).
template <typename T, class Source>
void launch_rows(const Fp8Tensor& out, const Source& src, int64_t rows, int64_t cols, bool src_vector,
                 cudaStream_t s) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const bool vector = src_vector && cols % kVec == 0 && aligned(out.codes.data, kVec);
  const int64_t row_tiles = tiles(cols), all_tiles = rows * row_tiles;
  MOE_CHECK(all_tiles <= std::numeric_limits<int32_t>::max(), "FP8 quantize rows: [", rows, ", ", cols, "] has ",
            all_tiles, " tiles, more than one launch indexes (2^31 - 1)");
  const int64_t tiles_per_step = (32 / (kTile / kVec)) * kRowsUnroll;
  const int64_t warps = (all_tiles + tiles_per_step - 1) / tiles_per_step;
  quantize_rows_kernel<T, Source><<<grid_stride_blocks(warps * 32, kThreads), kThreads, 0, s>>>(
      src, out.codes.ptr<uint8_t>(), out.scales.ptr<float>(), cols, FastDivmod(static_cast<uint32_t>(row_tiles)),
      static_cast<int32_t>(all_tiles), vector);
  CUDA_CHECK_LAUNCH();
}

// The segments of a columns quantizer: the device offsets [G + 1] (nullptr: one segment, from
// empty offsets) and G.
struct Segments {
  const int32_t* offsets = nullptr;
  int count = 1;
};
inline Segments segments_of(const Tensor& offsets) {
  if (offsets.empty() || offsets.numel() == 0) return {};
  return {offsets.ptr<const int32_t>(), static_cast<int>(offsets.numel() - 1)};
}

// The columns output of `out` (codes [K, Mp]).
inline ColumnsOutput columns_output(const Fp8Tensor& out, int64_t Mp) {
  return {out.codes.ptr<uint8_t>(), out.scales.ptr<float>(), Mp, out.codes.dim(0),
          Mp % 4 == 0 && aligned(out.codes.data, 4), Mp % 8 == 0 && aligned(out.codes.data, 8)};
}

// Quantizes the values of src [M, K] (element type T) along the tokens into `out` (codes [K, Mp]),
// in the segments of `offsets` (empty: one), and with `rows` also into its Rows tiles: one block per
// column tile. src_vector: the source's 16-byte runs are aligned (its own condition).
//
// NOTES: block order. A block's feature tile varies fastest (a row tile's blocks run together). The
// other order (all column tiles of one feature tile, so a gathered source's 8 reads of a token row
// hit L2) made the gathered output gradient's rows and columns 1.29 -> 1.45 ms per bench-olmoe-4l
// layer (its rows stores scatter) and saved 0.02 in the input columns (bench/RESULTS.md, thirteenth
// session).
template <typename T, class Source>
void launch_columns(const Fp8Tensor& out, const Source& src, const Tensor& offsets, int64_t M, int64_t K, int64_t Mp,
                    bool src_vector, const Fp8Tensor* rows, const char* op, cudaStream_t s) {
  const Segments segments = segments_of(offsets);
  const int64_t feature_tiles = tiles(K), blocks = tiles(Mp) * feature_tiles;
  MOE_CHECK(blocks <= 2147483647, op, ": ", blocks, " tiles exceed one launch");
  const ColumnsOutput columns = columns_output(out, Mp);
  if (rows == nullptr) {
    quantize_columns_kernel<T, false, Source><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
        src, segments.offsets, segments.count, M, K, feature_tiles, src_vector, columns, RowsOutput{});
  } else {
    const RowsOutput rows_out{rows->codes.ptr<uint8_t>(), rows->scales.ptr<float>(),
                              K % 16 == 0 && aligned(rows->codes.data, 16)};
    quantize_columns_kernel<T, true, Source><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
        src, segments.offsets, segments.count, M, K, feature_tiles, src_vector, columns, rows_out);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda::fp8_tiles

// The 128 x 128 weight block held by a 256-thread block: its thread layout, loads, and the store of
// its FP8 codes in both orientations (Blocks tiles, moe/ops/fp8.h). Shared by the kernels that
// quantize weights: fp8_quantize_blocks (fp8_quantize.cu) and the AdamW update that writes the
// caches of the weights it updates (fp8_adamw.cu), so both write the same bits.
// Include only from .cu files (device code).
#pragma once

#include <cstdint>

#include "moe/core/fp8.h"
#include "moe/ops/cuda/fp8_tiles.cuh"

namespace moe::cuda::fp8_tiles {

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


// Where one weight block's codes and scale go: codes [E, N, K] with scales [E, n_tiles, k_tiles] and,
// when codes_t is not null, codes_t [E, K, N] with scales_t [E, k_tiles, n_tiles]. word_ok(_t):
// 4-byte code stores are aligned in that orientation.
struct BlockTarget {
  uint8_t* codes;
  float* scales;
  uint8_t* codes_t;
  float* scales_t;
  int64_t N, K, n_tiles, k_tiles;
  bool word_ok, word_ok_t;
};

// Quantizes the block (e, bi, bj) whose values the threads hold in v (TileThread layout, zeros
// outside the rows x cols valid part): one amax over the block (a barrier), its scale, the codes
// from registers and, when asked, the transposed codes through shared memory. Every thread of the
// block must call it.
__device__ __forceinline__ void store_block(const float (&v)[4][4][4], const BlockTarget& b, int64_t e, int64_t bi,
                                            int64_t bj, int rows, int cols, const TileThread& t, TileShared& sh) {
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
    b.scales[(e * b.n_tiles + bi) * b.k_tiles + bj] = scale;
    if (b.scales_t != nullptr) b.scales_t[(e * b.k_tiles + bj) * b.n_tiles + bi] = scale;
  }
  const TileQuantizer quantize(scale);

  const int64_t N = b.N, K = b.K, n0 = bi * kTile, k0 = bj * kTile;
  uint8_t* dst = b.codes + e * N * K;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t column_words[4] = {0, 0, 0, 0};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int r = 4 * t.rq + s, c = t.column(i);
      const uint32_t q = quantize.word(v[i][s][0], v[i][s][1], v[i][s][2], v[i][s][3]);
#pragma unroll
      for (int x = 0; x < 4; ++x) column_words[x] |= ((q >> (8 * x)) & 0xffu) << (8 * s);
      if (r < rows) {
        const int valid = min(max(cols - c, 0), 4);
        uint8_t* p = dst + (n0 + r) * K + k0 + c;
        if (b.word_ok && valid == 4) {
          *reinterpret_cast<uint32_t*>(p) = q;
        } else {
          for (int x = 0; x < valid; ++x) p[x] = static_cast<uint8_t>(q >> (8 * x));
        }
      }
    }
    if (b.codes_t != nullptr) {
#pragma unroll
      for (int x = 0; x < 4; ++x) sh.words[(t.column(i) + x) * kStrideWords + t.rq] = column_words[x];
    }
  }
  if (b.codes_t == nullptr) return;
  __syncthreads();
  write_transposed(sh.words, b.codes_t + e * K * N, N, k0, cols, n0, rows, b.word_ok_t, t);
}

}  // namespace moe::cuda::fp8_tiles

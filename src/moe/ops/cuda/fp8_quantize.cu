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
//   quantize_columns_staged_kernel  both layouts of BF16 with 16-byte aligned rows (the training
//                            step's output gradients; fp8_rows_and_columns_staged.cuh, with the
//                            gathered sources of fp8_gather.cu): resident blocks looping over the
//                            column tiles, each copied into one of two 32 KiB shared-memory stages
//                            by cp.async while the other is quantized; each half reads the stage
//                            in the order its stores want.
//   quantize_columns_kernel  one 256-thread block per (128 tokens of one segment) x (128
//                            features), each warp alone on 16 features (lane: 4 rows x 16
//                            features in registers, loaded up front): column amax by a halving
//                            exchange across the warp, codes stored as 4-byte words along the
//                            tokens (a feature's 128 codes leave as one coalesced 128-byte row).
//                            Each warp finds its segment itself from the device offsets (a warp
//                            scan of round_up(M_g, 128)), so no host copy, extra launch or barrier
//                            is needed. With the Rows output too (fp8_quantize_rows_and_columns
//                            of F32 or unaligned BF16), one barrier shares each row's amax across
//                            the 8 warps.
//   quantize_blocks_kernel   the same block shape over one 128 x 128 weight block: one amax, codes
//                            written from registers ([N, K]) and, when asked, transposed through
//                            shared memory ([K, N]). 1 read + 2 writes of a byte per F32 read.
//   dequantize_kernel        one thread per element (tests and checks; not a hot path).
// Measured on the H200 (MOE_BENCH=1 test_cuda_fp8, [16384, 2048] BF16, 2026-12-03): rows 2.7 TB/s,
// columns 3.0, rows and columns (staged) 2.5; blocks (F32, both orientations) 3.2 TB/s.
#include "moe/ops/cuda/fp8.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "moe/core/cuda_check.h"
#include "moe/core/fp8.h"
#include "moe/ops/cuda/element.cuh"
#include "moe/ops/cuda/fp8_block_tile.cuh"
#include "moe/ops/cuda/fp8_rows_and_columns_staged.cuh"
#include "moe/ops/cuda/fp8_tiles.cuh"

namespace moe::cuda {
namespace {

using namespace fp8_tiles;

template <typename T>
__device__ __forceinline__ void store_value(T* p, float v);
template <>
__device__ __forceinline__ void store_value<float>(float* p, float v) { *p = v; }
template <>
__device__ __forceinline__ void store_value<__nv_bfloat16>(__nv_bfloat16* p, float v) { *p = f32_to_bf16_bits(v); }

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

  store_block(v, BlockTarget{codes, scales, codes_t, scales_t, N, K, n_tiles, k_tiles, word_ok, word_ok_t}, e, bi, bj,
              rows, cols, t, sh);
}

// ---------------------------------------------------------------------------------------------
// Dequantize: out [batches, R, C] = e4m3(code) * scale; tile_rows 1 (Rows, Columns) or 128 (Blocks);
// tile_major: Columns' scales [ceil(C / 128), R].

template <typename T>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(T* out, const uint8_t* codes, const float* scales,
                                                              int64_t total, int64_t R, int64_t C, int tile_rows,
                                                              bool tile_major) {
  const int64_t col_tiles = (C + kTile - 1) / kTile;
  const int64_t row_tiles = (R + tile_rows - 1) / tile_rows;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / C, c = i - row * C;
    const int64_t b = row / R, r = row - b * R;
    const float scale = tile_major ? scales[c / kTile * R + r]
                                   : scales[(b * row_tiles + r / tile_rows) * col_tiles + c / kTile];
    store_value<T>(out + i, fp8::e4m3_to_f32(codes[i]) * scale);
  }
}

// Rows of a tensor with every dim but the last folded in.
int64_t folded_rows(const Tensor& t) {
  int64_t rows = 1;
  for (int i = 0; i + 1 < t.ndim(); ++i) rows *= t.dim(i);
  return rows;
}


template <typename T>
void launch_dequantize(const Tensor& out, const Fp8Tensor& in, cudaStream_t s) {
  const int64_t total = in.codes.numel();
  const int64_t C = in.codes.dim(-1);
  const int64_t R = in.tiles == Fp8Tiles::Blocks ? in.codes.dim(-2) : folded_rows(in.codes);
  dequantize_kernel<T><<<grid_stride_blocks(total, kThreads), kThreads, 0, s>>>(
      out.ptr<T>(), in.codes.ptr<const uint8_t>(), in.scales.ptr<const float>(), total, R, C,
      in.tiles == Fp8Tiles::Blocks ? kTile : 1, in.tiles == Fp8Tiles::Columns);
  CUDA_CHECK_LAUNCH();
}

// x's values along the tokens (and with `rows` also as Rows tiles: the staged kernel where it
// fits, fp8_rows_and_columns_staged.cuh), else one block per tile. 16-byte loads of a warp's
// 16-feature runs need every row start aligned.
void quantize_tensor_columns(const Fp8Tensor& out, const Tensor& x, const Tensor& offsets, int64_t M, int64_t K,
                             int64_t Mp, const Fp8Tensor* rows, const char* op, cudaStream_t s) {
  if (rows != nullptr && staged_source_fit(x, K, rows)) {
    launch_columns_staged(out, StagedTensor{x.ptr<const __nv_bfloat16>(), K}, offsets, M, K, Mp, rows, op, s);
  } else if (x.dtype == DType::BF16) {
    const bool vector = K % 8 == 0 && aligned(x.data, 16);
    launch_columns<__nv_bfloat16>(out, TensorColumns<__nv_bfloat16>{x.ptr<const __nv_bfloat16>(), K}, offsets, M, K,
                                  Mp, vector, rows, op, s);
  } else {
    const bool vector = K % 4 == 0 && aligned(x.data, 16);
    launch_columns<float>(out, TensorColumns<float>{x.ptr<const float>(), K}, offsets, M, K, Mp, vector, rows, op, s);
  }
}

}  // namespace

void fp8_quantize_rows(Fp8Tensor out, Tensor x, Stream stream) {
  const int64_t rows = folded_rows(x), cols = x.dim(-1);
  if (rows == 0 || cols == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  const bool vector = aligned(x.data, 16);
  if (x.dtype == DType::BF16)
    launch_rows<__nv_bfloat16>(out, TensorRows<__nv_bfloat16>{x.ptr<const __nv_bfloat16>(), cols}, rows, cols, vector,
                               s);
  else
    launch_rows<float>(out, TensorRows<float>{x.ptr<const float>(), cols}, rows, cols, vector, s);
}

void fp8_quantize_columns(Fp8Tensor out, Tensor x, Tensor offsets, Stream stream) {
  const int64_t M = folded_rows(x), K = x.dim(-1), Mp = out.codes.dim(-1);
  if (K == 0 || Mp == 0) return;
  quantize_tensor_columns(out, x, offsets, M, K, Mp, nullptr, "fp8_quantize_columns", cuda_stream(stream));
}

void fp8_quantize_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, Tensor x, Tensor offsets, Stream stream) {
  const int64_t M = folded_rows(x), K = x.dim(-1), Mp = columns.codes.dim(-1);
  if (K == 0 || Mp == 0) return;
  quantize_tensor_columns(columns, x, offsets, M, K, Mp, &rows, "fp8_quantize_rows_and_columns", cuda_stream(stream));
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

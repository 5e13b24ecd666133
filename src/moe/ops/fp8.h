// FP8 (E4M3, power-of-two tile scales; moe/core/fp8.h) quantization and matrix products for
// train.precision = "fp8". The CPU runs the same quantization (same bits) and emulates each FP8
// product exactly: it dequantizes both operands (exact in FP32) and multiplies in FP32. The GPU
// multiplies the codes on Hopper's FP8 tensor cores with FP32 accumulation, applying the scales
// once per 128-deep slice of the contraction (the DeepSeek-V3 promotion), so the CPU and the GPU
// differ only in summation order.
//
// Tiles (every product contracts over the last, contiguous dim of both operands: "NT"):
//   Rows     (1 x 128): activations and gradients. x [M, K]: scales [M, ceil(K / 128)]; tile (m, j)
//                       is x[m, 128 j : 128 j + 128).
//   Blocks (128 x 128): weights. w [N, K] (or [E, N, K]): scales [ceil(N/128), ceil(K/128)] (or
//                       [E, ...]); block (i, j) is w[128 i : 128 i + 128, 128 j : 128 j + 128).
//   Columns  (1 x 128): the weight gradient's operands (below). codes [K, Mp]: scales
//                       [ceil(Mp / 128), K], tile-major; tile (k, j) is codes[k, 128 j : 128 j + 128).
// A partial tile at an edge is scaled over the elements it has.
//
// The weight gradient contracts over tokens, so its operands are quantized along the tokens and
// stored transposed ("columns"): x [M, K] gives codes [K, Mp] with Columns tiles along Mp. Their
// scales are tile-major (one token tile's scales contiguous over the K features), the order the
// weight gradients read them in, 128 features per 128-deep slice: CUTLASS's M-major scales (5.8% and
// 3.3% off the expert weight gradients on an H100 against K-major ones, bench/RESULTS.md,
// thirty-second session) and cuBLASLt's VEC128_32F layout (the dense weight gradient passes them to
// cuBLASLt as they are, without the restaging the other operands get). Rows are
// split into segments (the experts' row ranges, from offsets [G + 1]; a dense layer has one), and
// segment g starts at column p_g = sum over g' < g of round_up(M_g', 128), so that no tile spans two
// experts and every segment starts on a tile; Mp = columns_capacity(M, G) bounds p_G for any split
// of M rows. Columns between segments hold code 0 (they contribute nothing to any product): the
// columns past a segment's rows in its last tile (that tile keeps the segment's scale) and every
// column from p_G to Mp (those tiles have scale 1).
#pragma once

#include <cstdint>

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

inline constexpr int64_t kFp8Tile = 128;

enum class Fp8Tiles : uint8_t { Rows, Blocks, Columns };

// E4M3 codes (DType::FP8_E4M3) with their F32 scales (shapes above).
struct Fp8Tensor {
  Tensor codes;
  Tensor scales;
  Fp8Tiles tiles = Fp8Tiles::Rows;
};

// Shapes of the scales for codes of shape [.., rows, cols] (leading dims kept); Columns tiles (codes
// [K, Mp] only): [ceil(Mp / 128), K].
Shape fp8_scale_shape(const Shape& codes, Fp8Tiles tiles);
// Mp for M rows in G segments: round_up(M, 128) + 128 * (G - 1), a bound on p_G for any split.
int64_t fp8_columns_capacity(int64_t rows, int64_t segments);

// x [M, K] (F32 or BF16) -> out (Rows tiles, codes [M, K]).
void fp8_quantize_rows(Fp8Tensor out, Tensor x, Stream stream = {});

// x [M, K] -> out (Columns tiles: along the tokens, codes [K, Mp], Mp >= fp8_columns_capacity(M, G)),
// segments from offsets (I32 [G + 1], offsets[0] = 0, offsets[G] <= M, read on x's device; empty, a
// default Tensor or one without elements: one segment of all M rows). Writes every column of out,
// the padding with zeros.
void fp8_quantize_columns(Fp8Tensor out, Tensor x, Tensor offsets, Stream stream = {});

// Both quantizations of x in one pass over it (a gradient feeds the data gradient as Rows tiles
// and the weight gradient as columns): rows as fp8_quantize_rows, columns as fp8_quantize_columns.
// Rows of x outside every segment (past offsets[G]) may be left unwritten in `rows`.
void fp8_quantize_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, Tensor x, Tensor offsets, Stream stream = {});

// w [N, K] or [E, N, K] (F32) -> out (Blocks tiles, codes w's shape) and, when out_t.codes is not
// empty, the transposed orientation out_t (codes [K, N] or [E, K, N], scales transposed: the same
// values). The weight caches at init and load, and once per step after the ZeRO-1 gather when a
// stage has several data-parallel ranks (with one, adamw_step_quantize_blocks writes them).
void fp8_quantize_blocks(Fp8Tensor out, Fp8Tensor out_t, Tensor w, Stream stream = {});

// The exact values the codes stand for: out (F32 or BF16, codes' shape) = e4m3(code) * scale.
void fp8_dequantize(Tensor out, Fp8Tensor in, Stream stream = {});

// c [M, N] (= or +=, per accumulate) a [M, K] * b [N, K]^T: a Rows or Columns tiles (the weight
// gradient's columns operands); b Blocks tiles (weights), Rows or Columns tiles. c is BF16 or F32 on
// the GPU, F32 on the CPU.
void fp8_matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, bool accumulate, Stream stream = {});

// Expert products over an expert-major row buffer (moe/ops/grouped_gemm.h): for each expert e with
// rows [o_e, o_{e+1}): c[o_e:o_{e+1}] = a[o_e:o_{e+1}] * b[e]^T; a [rows, K] Rows tiles, b [E, N, K]
// Blocks tiles, c [rows, N]. The forward uses the weights' cache, the data gradient their
// transposed cache.
void fp8_grouped_matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, Tensor expert_offsets, Stream stream = {});

// Expert weight gradient: db[e] (+= when accumulate, else =) dc_e^T x_e over expert e's rows, from
// the columns operands dc_t (codes [N, Mp]) and x_t (codes [K, Mp]) quantized with the same
// expert_offsets. db [E, N, K] F32. With accumulate = false an expert without rows gets zeros.
void fp8_grouped_matmul_wgrad(Tensor db, Fp8Tensor dc_t, Fp8Tensor x_t, Tensor expert_offsets, bool accumulate,
                              Stream stream = {});

}  // namespace moe

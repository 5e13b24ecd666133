// FP8 operands of expert-buffer rows quantized straight from the token rows they copy. With every
// route on this rank (EP = 1) row r of the expert input is the token row x[t] of its route
// i = t * top_k + k, and row r of the expert output gradient is weights[i] * dout[t]: the weight
// gradients read them as FP8 columns (along the tokens) and the data gradient the output gradient
// as FP8 rows, so these ops quantize them from the token rows without the expert-major copy being
// stored (or read back). Bits: those of scatter_rows_to_routes (no weights) or combine_rows_backward
// (weights) followed by fp8_quantize_columns / fp8_quantize_rows_and_columns (moe/ops/fp8.h).
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"

namespace moe {

// The expert-major rows of token rows x [T, D] (F32 or BF16): row r holds route i = route_of_row[r]
// (I32 [M], invert_route_index of the route index; -1 for a row no route fills, whose values are
// zeros), that is x[i / top_k], times weights[i] (F32 [T, top_k]) when weights is not empty, the
// product taken in FP32 and rounded to x's dtype as combine_rows_backward rounds it.
struct GatheredRows {
  Tensor x;
  Tensor route_of_row;
  Tensor weights;
  int top_k = 1;
};

// The gathered rows [M, D] quantized along the tokens, in the segments of offsets (as
// fp8_quantize_columns: codes [D, Mp]).
void fp8_quantize_gathered_columns(Fp8Tensor columns, const GatheredRows& src, Tensor offsets, Stream stream = {});
// Both layouts in one pass (as fp8_quantize_rows_and_columns: rows codes [M, D]; rows of no
// segment may be left unwritten).
void fp8_quantize_gathered_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, const GatheredRows& src,
                                            Tensor offsets, Stream stream = {});

}  // namespace moe

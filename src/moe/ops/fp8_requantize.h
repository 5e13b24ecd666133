// FP8 rows re-quantized along the tokens in one pass: the weight gradient of an expert whose input
// arrived as FP8 rows (ep.payload = "fp8") needs that input's columns operand (moe/ops/fp8.h).
#pragma once

#include "moe/core/dtype.h"
#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"

namespace moe {

// out = the columns operand (codes [K, Mp]) of the values the Rows-tiled x (codes [M, K]) stands
// for, in the segments of offsets (empty: one segment): bit for bit what fp8_dequantize of x into a
// tensor of `values` (F32 or BF16) followed by fp8_quantize_columns gives, without that tensor.
void fp8_requantize_columns(Fp8Tensor out, Fp8Tensor x, DType values, Tensor offsets, Stream stream = {});

}  // namespace moe

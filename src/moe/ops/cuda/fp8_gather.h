// CUDA FP8 operands of gathered token rows (semantics: moe/ops/fp8_gather.h; arguments checked
// there). route_of_row entries outside [-1, T * top_k) are treated as -1 (a row of zeros).
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"
#include "moe/ops/fp8_gather.h"

namespace moe::cuda {

void fp8_quantize_gathered_columns(Fp8Tensor columns, const GatheredRows& src, Tensor offsets, Stream stream);
void fp8_quantize_gathered_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, const GatheredRows& src,
                                            Tensor offsets, Stream stream);

}  // namespace moe::cuda

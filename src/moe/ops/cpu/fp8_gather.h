// CPU FP8 operands of gathered token rows. Semantics: moe/ops/fp8_gather.h.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"
#include "moe/ops/fp8_gather.h"

namespace moe::cpu {

void fp8_quantize_gathered_columns(Fp8Tensor columns, const GatheredRows& src, Tensor offsets, Stream stream);
void fp8_quantize_gathered_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, const GatheredRows& src,
                                            Tensor offsets, Stream stream);

}  // namespace moe::cpu

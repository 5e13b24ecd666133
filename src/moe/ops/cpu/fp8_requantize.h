// CPU FP8 rows -> columns. Semantics: moe/ops/fp8_requantize.h.
#pragma once

#include "moe/core/dtype.h"
#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"

namespace moe::cpu {

void fp8_requantize_columns(Fp8Tensor out, Fp8Tensor x, DType values, Tensor offsets, Stream stream);

}  // namespace moe::cpu

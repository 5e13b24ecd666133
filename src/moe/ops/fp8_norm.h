// The RMSNorm forward (moe/ops/norm.h) that also quantizes its output for the FP8 products that read
// it next (moe/ops/fp8.h): with train.precision = "fp8" the input norm feeds the q/k/v projections,
// and a dense layer's post-attention norm its MLP's gate/up product, which then need no separate
// quantization pass over it. The output is still written (the weight
// gradient reads it along the tokens). The codes and scales equal those of rmsnorm_forward followed
// by fp8_quantize_rows on its (BF16 or F32) output, bit for bit on each device; the CPU computes
// exactly that, the GPU in one kernel (moe/ops/cuda/fp8_norm.cu).
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"

namespace moe {

// out, rstd as rmsnorm_forward(out, rstd, x, weight, eps) with x [R, C] (any leading dims), and
// out_rows (Rows tiles, codes [R, C]) = fp8_quantize_rows of out.
void fp8_rmsnorm_forward(Tensor out, Tensor rstd, Fp8Tensor out_rows, Tensor x, Tensor weight, float eps,
                         Stream stream = {});

}  // namespace moe

// CUDA RMSNorm. Semantics: moe/ops/norm.h (same signatures); ops/norm.cpp checks the arguments.
//
// Dtypes: x, weight, out (forward) and dx, dout, x, weight (backward) share one dtype T, F32 or
// BF16 (__nv_bfloat16); arithmetic and row reductions run in FP32. rstd is F32. dweight is F32 and
// accumulated (+=). All tensors live on the CUDA device; the ops run on `stream`, allocate nothing
// and never synchronize. Results are deterministic (fixed reduction order, no atomics).
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe::cuda {

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, Stream stream = {});
void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd,
                      bool accumulate_dx, Stream stream = {});

}  // namespace moe::cuda

// The CUDA RMSNorm forward that quantizes its output (semantics: moe/ops/fp8_norm.h; the arguments
// are checked there).
#pragma once

#include "moe/ops/fp8_norm.h"

namespace moe::cuda {

void fp8_rmsnorm_forward(Tensor out, Tensor rstd, Fp8Tensor out_rows, Tensor x, Tensor weight, float eps,
                         Stream stream);

}  // namespace moe::cuda

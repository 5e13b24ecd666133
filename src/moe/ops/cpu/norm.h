// CPU RMSNorm. Semantics: moe/ops/norm.h.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe::cpu {

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, Stream stream);
void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd,
                      bool accumulate_dx, Stream stream);

}  // namespace moe::cpu

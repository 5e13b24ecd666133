// The CPU RMSNorm forward that quantizes its output: the reference meaning of moe/ops/fp8_norm.h
// (same signature; ops/fp8_norm.cpp checks the arguments).
#pragma once

#include "moe/ops/fp8_norm.h"

namespace moe::cpu {

void fp8_rmsnorm_forward(Tensor out, Tensor rstd, Fp8Tensor out_rows, Tensor x, Tensor weight, float eps,
                         Stream stream);

}  // namespace moe::cpu

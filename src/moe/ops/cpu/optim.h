// CPU optimizer ops: the reference meaning of ops/optim.h (same signatures).
#pragma once

#include "moe/ops/optim.h"

namespace moe::cpu {

void sum_squares_accumulate(Tensor out, Tensor x, Stream stream = {});
void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                const AdamWConfig& cfg, int64_t step, Stream stream = {}, Tensor schedule = {},
                Tensor param_bf16 = {});

}  // namespace moe::cpu

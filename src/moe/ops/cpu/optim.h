// CPU optimizer ops: the reference meaning of ops/optim.h (same signatures; ops/optim.cpp checks
// the arguments).
#pragma once

#include "moe/ops/optim.h"

namespace moe::cpu {

// No workspace: the block partials live in a host vector.
int64_t sum_squares_workspace_elems(int64_t n);
void sum_squares_accumulate(Tensor out, Tensor x, Tensor workspace, Stream stream = {});
void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                const AdamWConfig& cfg, int64_t step, Stream stream = {}, Tensor schedule = {},
                Tensor param_bf16 = {});

}  // namespace moe::cpu

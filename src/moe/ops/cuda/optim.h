// CUDA optimizer ops. Semantics: moe/ops/optim.h (same signatures).
//
// Dtypes: every tensor is F32 (FP32 master weights and gradients) except the AdamW moments, F32
// or BF16 (the same bits as the CPU op: BF16 stores round to nearest even), and param_bf16;
// ops/optim.cpp checks the call. On the CUDA device,
// on `stream`, no allocation, no synchronization: adamw_step reads grad_norm_sq from device
// memory inside its kernel, so the clip factor and the non-finite skip are decided on the device;
// with a schedule it also reads lr and step there (the step is not checked: it must be >= 1).
// NOTES: sum_squares_accumulate writes its per-block partial sums (min(1024, ceil(n / 256))
// floats) into the caller's workspace and reduces them with a second single-block kernel; the
// result is deterministic (the partition depends only on the element count). Each call owns its
// workspace, so calls on different streams may overlap when their workspaces differ.
#pragma once

#include "moe/ops/optim.h"

namespace moe::cuda {

int64_t sum_squares_workspace_elems(int64_t n);
void sum_squares_accumulate(Tensor out, Tensor x, Tensor workspace, Stream stream = {});
void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                const AdamWConfig& cfg, int64_t step, Stream stream = {}, Tensor schedule = {},
                Tensor param_bf16 = {});

}  // namespace moe::cuda

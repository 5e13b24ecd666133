// CUDA optimizer ops. Semantics: moe/ops/optim.h (same signatures).
//
// Dtypes: every tensor is F32 (FP32 master weights, gradients and moments). On the CUDA device,
// on `stream`, no allocation, no synchronization: adamw_step reads grad_norm_sq from device
// memory inside its kernel, so the clip factor and the non-finite skip are decided on the device;
// with a schedule it also reads lr and step there (the step is not checked: it must be >= 1).
// NOTES: sum_squares_accumulate keeps its per-block partial sums in one fixed static __device__
// array (1024 floats) and reduces it with a second single-block kernel; the result is
// deterministic (the partition depends only on the element count). Because that array is shared,
// two sum_squares_accumulate calls must not run concurrently on different streams.
#pragma once

#include "moe/ops/optim.h"

namespace moe::cuda {

void sum_squares_accumulate(Tensor out, Tensor x, Stream stream = {});
void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                const AdamWConfig& cfg, int64_t step, Stream stream = {}, Tensor schedule = {},
                Tensor param_bf16 = {});

}  // namespace moe::cuda

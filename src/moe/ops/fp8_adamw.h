// The AdamW update of a weight that train.precision = "fp8" quantizes, writing the weight's FP8
// caches (moe/model/fp8_weights.h) from the updated values in the same pass, so the caches cost no
// second read of the FP32 weights after the optimizer. The results equal adamw_step (moe/ops/optim.h)
// followed by fp8_quantize_blocks (moe/ops/fp8.h) of the updated param, bit for bit on each device;
// the CPU computes exactly that, the GPU in one kernel (moe/ops/cuda/fp8_adamw.cu).
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"
#include "moe/ops/optim.h"

namespace moe {

// adamw_step on param [N, K] or [E, N, K] (grad, m, v, grad_norm_sq, max_norm, cfg, step and
// schedule as there), then out (Blocks tiles, codes param's shape) and, when out_t.codes is not
// empty, out_t (codes [.., K, N]) = fp8_quantize_blocks of the new param. A skipped step (non-finite
// grad_norm_sq) writes nothing: the caches already hold the unchanged param's codes.
void adamw_step_quantize_blocks(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                                const AdamWConfig& cfg, int64_t step, Fp8Tensor out, Fp8Tensor out_t,
                                Stream stream = {}, Tensor schedule = {});

}  // namespace moe

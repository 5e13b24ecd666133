// The CUDA AdamW update that writes the FP8 caches of the weight it updates (semantics:
// moe/ops/fp8_adamw.h; the arguments are checked there).
#pragma once

#include "moe/ops/fp8_adamw.h"

namespace moe::cuda {

void adamw_step_quantize_blocks(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                                const AdamWConfig& cfg, int64_t step, Fp8Tensor out, Fp8Tensor out_t, Stream stream,
                                Tensor schedule);

}  // namespace moe::cuda

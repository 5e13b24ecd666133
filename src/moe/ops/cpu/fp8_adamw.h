// The CPU AdamW update that writes the FP8 caches of the weight it updates: the reference meaning of
// moe/ops/fp8_adamw.h (same signature; ops/fp8_adamw.cpp checks the arguments).
#pragma once

#include "moe/ops/fp8_adamw.h"

namespace moe::cpu {

void adamw_step_quantize_blocks(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                                const AdamWConfig& cfg, int64_t step, Fp8Tensor out, Fp8Tensor out_t, Stream stream,
                                Tensor schedule);

}  // namespace moe::cpu

// Argument checks shared by the AdamW ops (moe/ops/optim.h, moe/ops/fp8_adamw.h).
#pragma once

#include <cstdint>

#include "moe/core/tensor.h"
#include "moe/ops/op_checks.h"

namespace moe {

// param, grad (F32), m, v (both F32 or both BF16) of one shape, grad_norm_sq F32 [1], and the step
// (>= 1) or the schedule (F32 [2]; its step checked where it is readable on the host).
void check_adamw_step(const OpCheck& check, const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                      const Tensor& grad_norm_sq, int64_t step, const Tensor& schedule);

}  // namespace moe

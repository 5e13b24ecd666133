// CPU LM head fused with cross-entropy, chunked over rows. Semantics: moe/ops/loss.h.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe::cpu {

void lm_head_cross_entropy(Tensor loss_sum, Tensor dh, Tensor dweight, Tensor h, Tensor weight, Tensor targets,
                           float grad_scale, Tensor workspace, Stream stream);

}  // namespace moe::cpu

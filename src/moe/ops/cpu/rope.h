// CPU rotary position embedding. Semantics: moe/ops/rope.h.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe::cpu {

void rope_forward(Tensor x, int64_t seq_len, int64_t n_heads, float theta, Stream stream);
void rope_backward(Tensor dx, int64_t seq_len, int64_t n_heads, float theta, Stream stream);

}  // namespace moe::cpu

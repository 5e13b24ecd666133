// CUDA rotary position embedding. Semantics: moe/ops/rope.h (same signatures); ops/rope.cpp checks
// the arguments.
//
// Dtypes: x (dx) is F32 or BF16 (__nv_bfloat16), rotated in place; the rotation runs in FP32 with
// cos/sin computed in double and rounded to FP32 once, as the CPU op does. On the CUDA device,
// on `stream`, no allocation, no synchronization.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe::cuda {

void rope_forward(Tensor x, int64_t seq_len, int64_t n_heads, float theta, Stream stream = {});
void rope_backward(Tensor dx, int64_t seq_len, int64_t n_heads, float theta, Stream stream = {});

}  // namespace moe::cuda

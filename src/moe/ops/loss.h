// LM head fused with cross-entropy, processed in chunks of rows so the full [rows, vocab]
// logits tensor never exists.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

// h [R, D], weight [V, D], targets [R] i32 (-1 = ignored row), workspace [chunk, V] FP32
// (the chunk size is workspace.dim(0)).
//   loss_sum [1] = sum over non-ignored rows of -log softmax(h[r] W^T)[targets[r]];
//   when dh is non-empty: dh [R, D] (overwritten) = grad_scale * (softmax - onehot) W  (0 for ignored rows);
//   when dweight is non-empty: dweight [V, D] += grad_scale * (softmax - onehot)^T h.
void lm_head_cross_entropy(Tensor loss_sum, Tensor dh, Tensor dweight, Tensor h, Tensor weight, Tensor targets,
                           float grad_scale, Tensor workspace, Stream stream = {});

}  // namespace moe

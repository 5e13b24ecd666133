// Token embedding lookup and its gradient.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

// out[r] = table[tokens[r]]; tokens [R] i32, table [V, D], out [R, D]. The data loader validates
// token ids; the CPU also refuses an id outside [0, V) (see ops/cuda/embedding.h for the GPU).
void embedding_forward(Tensor out, Tensor table, Tensor tokens, Stream stream = {});
// dtable[tokens[r]] += dout[r] (accumulated; repeated tokens add up).
void embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Stream stream = {});

}  // namespace moe

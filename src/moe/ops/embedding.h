// Token embedding lookup and element-wise helpers used between layers.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

// out[r] = table[tokens[r]]; tokens [R] i32, table [V, D], out [R, D]. Token ids are checked
// against V by the data loader, not here.
void embedding_forward(Tensor out, Tensor table, Tensor tokens, Stream stream = {});
// dtable[tokens[r]] += dout[r] (accumulated; repeated tokens add up).
void embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Stream stream = {});

// y += x, same shapes (residual connections).
void add_inplace(Tensor y, Tensor x, Stream stream = {});
// y = 0.
void fill_zero(Tensor y, Stream stream = {});
// dst = src, same shapes and dtypes.
void copy(Tensor dst, Tensor src, Stream stream = {});

}  // namespace moe

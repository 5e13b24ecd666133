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
// dst = src converted to dst's dtype, same shapes: F32 -> BF16 rounds to nearest even (exactly as
// moe::f32_to_bf16), BF16 -> F32 is exact, equal dtypes copy. The BF16 refresh of compute weights
// from the FP32 master weights.
void cast_copy(Tensor dst, Tensor src, Stream stream = {});

}  // namespace moe

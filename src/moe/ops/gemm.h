// Dense matrix products.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

// c = alpha * op(a) * op(b) + beta * c, FP32 accumulation.
// a is [M, K] ([K, M] when trans_a), b is [K, N] ([N, K] when trans_b), c is [M, N].
// Tensors of rank > 2 are treated as 2-D by folding all leading dims into rows.
// Linear layer y = x W^T with W [out, in]: matmul(y, x, W, false, true, 1, 0).
void matmul(Tensor c, Tensor a, Tensor b, bool trans_a, bool trans_b, float alpha, float beta, Stream stream = {});

}  // namespace moe

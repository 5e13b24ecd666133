// CPU dense matrix products (OpenBLAS sgemm). Semantics: moe/ops/gemm.h.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe::cpu {

void matmul(Tensor c, Tensor a, Tensor b, bool trans_a, bool trans_b, float alpha, float beta, Stream stream);

}  // namespace moe::cpu

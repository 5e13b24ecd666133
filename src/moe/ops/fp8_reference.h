// The reference the GPU's FP8 products are checked against (kernel_choice() == Reference: what
// `moetrain bench --check` compares the fast kernels with): both operands dequantized into BF16
// (exact: a power-of-two scale times a 4-bit significand fits BF16, down to 2^-133) and multiplied
// by the plain BF16 products (cuBLASLt, the tiled grouped kernel). The fast FP8 kernels must give
// the same sums up to their order. Allocates its BF16 copies per call: eager use only, never
// inside a CUDA graph capture. The weight gradient has no reference: --check runs a forward.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"

namespace moe::fp8_reference {

void matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, bool accumulate, Stream stream);
void grouped_matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, Tensor expert_offsets, Stream stream);

}  // namespace moe::fp8_reference

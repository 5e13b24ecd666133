// Element-wise helpers used between layers and around the optimizer: residual adds, zeroing,
// copies, the BF16 refresh of compute weights, and the on-device sums of per-step scalars.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

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

// One term of accumulate_scalars: stats[slot] += scale * src[index]; src F32 or I32.
struct ScalarTerm {
  Tensor src;
  int64_t index = 0;
  int64_t slot = 0;
  float scale = 1.0f;
};
// Adds each term into stats (F32, same device as every src), in order (deterministic). Lets the GPU
// path sum per-microbatch losses and counters on the device, read once after the step.
// Each term rounds like FP32 code without fused multiply-add: the product scale * value (an I32
// value converted to F32 first), then the sum. No terms: nothing happens.
void accumulate_scalars(Tensor stats, const std::vector<ScalarTerm>& terms, Stream stream = {});

}  // namespace moe

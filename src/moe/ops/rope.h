// Rotary position embedding, the "rotate half" convention of Hugging Face Llama/OLMoE:
// for head dim hd and i < hd/2, the pair (x_i, x_{i+hd/2}) at position p is rotated by angle
// p * theta^(-2i/hd). Positions restart at 0 for every sequence.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

// In place on x [B*T, H*hd] (token-major rows, heads side by side); token row r has position r % seq_len.
void rope_forward(Tensor x, int64_t seq_len, int64_t n_heads, float theta, Stream stream = {});
// In place: dx <- R^T dx (the inverse rotation), the gradient of rope_forward.
void rope_backward(Tensor dx, int64_t seq_len, int64_t n_heads, float theta, Stream stream = {});

}  // namespace moe

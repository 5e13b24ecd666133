// The precision of the model's matrix products (`train.precision`).
//
//   bf16: every product in the activation dtype (BF16 on the GPU, FP32 on the CPU), FP32 accumulation.
//   fp8:  the linear layers (q/k/v/o projections, routed experts, shared expert, dense MLP) multiply
//         FP8 E4M3 codes with power-of-two blockwise scales (moe/core/fp8.h, moe/ops/fp8.h) in all
//         three passes: forward x W^T and data gradient dy W with the weights' 128x128-block caches
//         (written once per optimizer step from the FP32 weights, model/fp8_weights.h), weight
//         gradient dy^T x with both operands quantized along the tokens. The router, the norms,
//         attention, the embedding, the LM head and the loss stay as in bf16: they are small or
//         precision-sensitive (the router's top-K choice, the softmax statistics, the logits).
//         On the CPU the same quantization runs and each product is the exact product of the
//         dequantized values in FP32 (the numerics with a CPU meaning); the GPU needs Hopper (sm_90).
#pragma once

namespace moe {

enum class Precision { BF16, FP8 };

inline const char* to_string(Precision p) { return p == Precision::FP8 ? "fp8" : "bf16"; }

}  // namespace moe

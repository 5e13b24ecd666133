// The SwiGLU arithmetic of every CUDA kernel that computes it (activation.cu, and fp8_swiglu.cu and
// fp8_swiglu_staged.cu, which quantize what they compute): one definition, so the fused FP8 kernels
// round to the same BF16 bits as the plain kernels they replace. g: gate, u: up, d: the output's gradient,
// s = sigmoid(g).
#pragma once

#include <cuda_runtime.h>

namespace moe::cuda {

__device__ __forceinline__ float swiglu_sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// silu(g) u, computed as (g s) u.
__device__ __forceinline__ float swiglu_value(float g, float s, float u) { return g * s * u; }

// d (silu(g) u) / du = silu(g).
__device__ __forceinline__ float swiglu_grad_up(float d, float g, float s) { return d * g * s; }

// d (silu(g) u) / dg = u s (1 + g (1 - s)).
__device__ __forceinline__ float swiglu_grad_gate(float d, float g, float s, float u) {
  return d * u * s * (1.0f + g * (1.0f - s));
}

}  // namespace moe::cuda

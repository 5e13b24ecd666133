// The SwiGLU arithmetic of every CUDA kernel that computes it (activation.cu, and fp8_swiglu.cu and
// fp8_swiglu_staged.cu, which quantize what they compute): one definition, so the fused FP8 kernels
// round to the same BF16 bits as the plain kernels they replace. g: gate, u: up, d: the output's gradient,
// s = sigmoid(g).
#pragma once

#include <cuda_runtime.h>

namespace moe::cuda {

// The hardware exponential and reciprocal (MUFU.EX2, MUFU.RCP: a few ulp in FP32, far below BF16's
// rounding): expf and an IEEE division took ~18 instructions, a quarter of the quantizing SwiGLU
// forward's and a sixth of its backward's (Nsight Compute, 2026-12-04). Limits: g -> -inf gives
// 1 / inf = 0, g -> +inf gives 1 / (1 + 0) = 1, a NaN stays NaN.
__device__ __forceinline__ float swiglu_sigmoid(float g) { return __fdividef(1.0f, 1.0f + __expf(-g)); }

// silu(g) u, computed as (g s) u.
__device__ __forceinline__ float swiglu_value(float g, float s, float u) { return g * s * u; }

// d (silu(g) u) / du = silu(g).
__device__ __forceinline__ float swiglu_grad_up(float d, float g, float s) { return d * g * s; }

// d (silu(g) u) / dg = u s (1 + g (1 - s)).
__device__ __forceinline__ float swiglu_grad_gate(float d, float g, float s, float u) {
  return d * u * s * (1.0f + g * (1.0f - s));
}

}  // namespace moe::cuda

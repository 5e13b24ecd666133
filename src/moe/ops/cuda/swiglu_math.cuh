// The SwiGLU arithmetic of every CUDA kernel that computes it (activation.cu, and fp8_swiglu.cu and
// fp8_swiglu_staged.cu, which quantize what they compute): one definition, so the fused FP8 kernels
// round to the same BF16 bits as the plain kernels they replace. g: gate, u: up, d: the output's gradient,
// s = sigmoid(g).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

namespace moe::cuda {

// sigmoid(g) for outputs of type T. BF16 (every training activation): the hardware exponential and
// reciprocal (__expf: 2 + floor(1.173 |g|) ulp in FP32, at most ~1e-5 relative for |g| < 88; then
// MUFU.RCP), far below BF16's 2^-9 rounding; expf and an IEEE division took ~18 instructions, a
// quarter of the quantizing SwiGLU forward's and a sixth of its backward's (Nsight Compute,
// 2026-12-04). Limits: g -> -inf gives 1 / inf = 0 (from g < ~-87.3, where the exact value is below
// FP32's normal range), g -> +inf gives 1, a NaN stays NaN. F32 outputs keep expf and the IEEE
// division: their precision is FP32's.
template <typename T>
__device__ __forceinline__ float swiglu_sigmoid(float g) {
  if constexpr (std::is_same_v<T, float>) {
    return 1.0f / (1.0f + expf(-g));
  } else {
    return __fdividef(1.0f, 1.0f + __expf(-g));
  }
}

// silu(g) u, computed as (g s) u.
__device__ __forceinline__ float swiglu_value(float g, float s, float u) { return g * s * u; }

// d (silu(g) u) / du = silu(g).
__device__ __forceinline__ float swiglu_grad_up(float d, float g, float s) { return d * g * s; }

// d (silu(g) u) / dg = u s (1 + g (1 - s)).
__device__ __forceinline__ float swiglu_grad_gate(float d, float g, float s, float u) {
  return d * u * s * (1.0f + g * (1.0f - s));
}

}  // namespace moe::cuda

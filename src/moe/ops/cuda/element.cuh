// Element conversions shared by the CUDA kernels: loads widen F32/BF16 to FP32 (all arithmetic
// is FP32), stores round FP32 to the tensor's type (BF16: round to nearest even).
#pragma once

#include <cuda_bf16.h>

namespace moe::cuda {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

}  // namespace moe::cuda

// Element conversions shared by the CUDA kernels: loads widen F32/BF16 to FP32 (all arithmetic
// is FP32), stores round FP32 to the tensor's type (BF16: round to nearest even).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <initializer_list>

#include "moe/core/dtype.h"

namespace moe::cuda {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// V elements moved as one word (16 bytes for V = 16 / sizeof(T)): vectorized loads and stores.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T e[V];
};

// The element type and word width a kernel is instantiated with (see with_vec_width).
template <typename T, int V>
struct VecType {
  using elem = T;
  static constexpr int width = V;
};

// Calls f(VecType<T, V>{}) for dtype (F32 or BF16), with V = 16 bytes of elements when a row of
// row_elems elements and every pointer in `pointers` are 16-byte aligned, else V = 1. Host code.
template <typename F>
void with_vec_width(DType dtype, int64_t row_elems, std::initializer_list<const void*> pointers, F&& f) {
  bool vec = row_elems * static_cast<int64_t>(dtype_size(dtype)) % 16 == 0;
  for (const void* p : pointers) vec = vec && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  if (dtype == DType::BF16) {
    if (vec)
      f(VecType<__nv_bfloat16, 8>{});
    else
      f(VecType<__nv_bfloat16, 1>{});
  } else {
    if (vec)
      f(VecType<float, 4>{});
    else
      f(VecType<float, 1>{});
  }
}

}  // namespace moe::cuda

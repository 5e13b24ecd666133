// Element conversions and accesses shared by the CUDA kernels: loads widen F32/BF16 to FP32 (all
// arithmetic is FP32), stores round FP32 to the tensor's type (BF16: round to nearest even).
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
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

// Bit-identical to moe::f32_to_bf16 (round to nearest even; a NaN stays a quiet NaN with its sign
// and top payload bits), so BF16 written on the device (weight refreshes, dequantized FP8) equals the host's, NaNs included.
__device__ __forceinline__ __nv_bfloat16 f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  uint16_t h;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    h = static_cast<uint16_t>((u >> 16) | 0x40);
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    h = static_cast<uint16_t>(u >> 16);
  }
  return __ushort_as_bfloat16(h);
}

// kVec consecutive elements of T moved in one access (kVec = 1, or 16 bytes: 4 F32 or 8 BF16): Raw
// holds their bits (one register per 4 bytes) between the load and the use, unpack widens them to
// FP32 exactly, store rounds FP32 to T (as from_f32).
template <typename T, int kVec>
struct VecAccess;

template <typename T>
struct VecAccess<T, 1> {
  using Raw = T;
  static __device__ __forceinline__ Raw load(const T* p) { return *p; }
  static __device__ __forceinline__ void unpack(Raw raw, float (&v)[1]) { v[0] = to_f32(raw); }
  static __device__ __forceinline__ void store(T* p, const float (&v)[1]) { *p = from_f32<T>(v[0]); }
};

template <>
struct VecAccess<float, 4> {
  using Raw = uint4;
  static __device__ __forceinline__ Raw load(const float* p) { return *reinterpret_cast<const uint4*>(p); }
  static __device__ __forceinline__ void unpack(Raw raw, float (&v)[4]) {
    v[0] = __uint_as_float(raw.x);
    v[1] = __uint_as_float(raw.y);
    v[2] = __uint_as_float(raw.z);
    v[3] = __uint_as_float(raw.w);
  }
  static __device__ __forceinline__ void store(float* p, const float (&v)[4]) {
    *reinterpret_cast<uint4*>(p) =
        make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
  }
};

// BF16 is the top half of an FP32: widening is a shift (as __bfloat162float). Little-endian: the
// element with the lower index is the low half of a word.
template <>
struct VecAccess<__nv_bfloat16, 8> {
  using Raw = uint4;
  static __device__ __forceinline__ Raw load(const __nv_bfloat16* p) { return *reinterpret_cast<const uint4*>(p); }
  static __device__ __forceinline__ void unpack_word(uint32_t word, float& lo, float& hi) {
    lo = __uint_as_float(word << 16);
    hi = __uint_as_float(word & 0xffff0000u);
  }
  static __device__ __forceinline__ void unpack(Raw raw, float (&v)[8]) {
    unpack_word(raw.x, v[0], v[1]);
    unpack_word(raw.y, v[2], v[3]);
    unpack_word(raw.z, v[4], v[5]);
    unpack_word(raw.w, v[6], v[7]);
  }
  static __device__ __forceinline__ uint32_t pack_word(float lo, float hi) {
    return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
  }
  static __device__ __forceinline__ void store(__nv_bfloat16* p, const float (&v)[8]) {
    *reinterpret_cast<uint4*>(p) =
        make_uint4(pack_word(v[0], v[1]), pack_word(v[2], v[3]), pack_word(v[4], v[5]), pack_word(v[6], v[7]));
  }
};

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

// Blocks of `threads` for a grid-stride loop over n items, at most max_blocks (the loop covers the
// rest). Host code.
inline unsigned grid_stride_blocks(int64_t n, int threads, int64_t max_blocks = int64_t{1} << 16) {
  return static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, max_blocks));
}

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

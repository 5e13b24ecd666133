// The CUDA RMSNorm forward kernel (design notes: norm.cu), templated on what it does with each
// normalized run of a row, so that a consumer's quantization can ride on it: StoreRows writes the
// output (rmsnorm_forward, norm.cu); fp8_norm.cu's sink also quantizes it for the FP8 product that
// reads it. Include only from .cu files (device code).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moe/ops/cuda/element.cuh"

namespace moe::cuda::rmsnorm_rows {

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

constexpr int kWarpsPerBlock = 8;
constexpr int kRowThreads = 32 * kWarpsPerBlock;
// Accesses per lane held in registers between a row kernel's two passes: a BF16 row of 2048
// columns; F32 rows keep 4 (512 columns), so that the dx kernel fits 128 registers unspilled.
template <int kVec>
constexpr int kCachedChunks = kVec == 4 ? 4 : 8;
// Columns per 16-byte access of T.
template <typename T>
constexpr int kVecOf = static_cast<int>(16 / sizeof(T));

// Lane `lane`'s columns of access i of a row: [i 32 kVec + lane kVec, + kVec). C % kVec == 0, so
// an access that starts inside the row lies inside it.
template <int kVec>
__device__ __forceinline__ int64_t access_column(int i, int lane) {
  return static_cast<int64_t>(i) * (32 * kVec) + lane * kVec;
}

// The plain output: y rounded to T, stored.
template <typename T, int kVec>
struct StoreRows {
  T* out;
  int64_t C;
  __device__ __forceinline__ void write(int64_t r, int64_t c, int /*lane*/, const float (&y)[kVec]) const {
    VecAccess<T, kVec>::store(out + r * C + c, y);
  }
};

// One warp per row; out.write(r, c, lane, y) receives lane's kVec values from column c (called for
// every access of the row whose columns exist, in access order).
template <typename T, int kVec, class Out>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_forward_kernel(Out out, float* rstd, const T* x, const T* weight, float eps, int64_t R, int64_t C) {
  using A = VecAccess<T, kVec>;
  constexpr int kStride = 32 * kVec;  // columns of one warp-wide access
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= R) return;  // whole warps leave together
  const T* xr = x + r * C;
  // The first kCachedChunks accesses stay in registers between the passes (their indices are
  // compile-time after unrolling); columns beyond are read again.
  typename A::Raw x_cached[kCachedChunks<kVec>] = {};
#pragma unroll
  for (int i = 0; i < kCachedChunks<kVec>; ++i)
    if (access_column<kVec>(i, lane) < C) x_cached[i] = A::load(xr + access_column<kVec>(i, lane));
  float sum_sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kCachedChunks<kVec>; ++i) {
    if (access_column<kVec>(i, lane) >= C) continue;
    float v[kVec];
    A::unpack(x_cached[i], v);
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum_sq += v[j] * v[j];
  }
  for (int64_t c = access_column<kVec>(kCachedChunks<kVec>, lane); c < C; c += kStride) {
    float v[kVec];
    A::unpack(A::load(xr + c), v);
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum_sq += v[j] * v[j];
  }
  sum_sq = warp_sum(sum_sq);
  const float rs = 1.0f / sqrtf(sum_sq / static_cast<float>(C) + eps);
  if (lane == 0) rstd[r] = rs;
  auto write = [&](int64_t c, typename A::Raw x_raw) {
    float xv[kVec], wv[kVec], y[kVec];
    A::unpack(x_raw, xv);
    A::unpack(A::load(weight + c), wv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) y[j] = xv[j] * rs * wv[j];
    out.write(r, c, lane, y);
  };
#pragma unroll
  for (int i = 0; i < kCachedChunks<kVec>; ++i)
    if (access_column<kVec>(i, lane) < C) write(access_column<kVec>(i, lane), x_cached[i]);
  for (int64_t c = access_column<kVec>(kCachedChunks<kVec>, lane); c < C; c += kStride) write(c, A::load(xr + c));
}

}  // namespace moe::cuda::rmsnorm_rows

// CUDA RMSNorm over the last dimension (see moe/ops/cuda/norm.h for the dtype contract).
//
// Kernels (kVec = columns per access: 8 BF16 or 4 F32 in one 16-byte access when C % kVec == 0
// and every row tensor's base is 16-byte aligned, so that each row x + r * C is too; kVec = 1
// otherwise, any C and alignment):
//   rmsnorm_forward_kernel  (rmsnorm_rows.cuh, templated on its output: fp8_norm.cu's also
//                           quantizes) one warp per row (8 rows per 256-thread block): lane l reads columns
//                           [l kVec, l kVec + kVec) of every 32 kVec; the first kCachedChunks
//                           accesses stay in registers (a BF16 row of 2048), further ones are read
//                           again. The warp sums x^2 (each lane in column order, then a shuffle
//                           tree) and writes out.
//   rmsnorm_dx_kernel       one warp per row the same way: dot = sum_c w_c g_c x_c, then dx.
//   rmsnorm_dweight_kernel  one block of 1024 threads per 16 columns (32 bytes of BF16: a DRAM
//                           sector per row): thread (row lane, column lane) sums rows row_lane,
//                           row_lane + row_lanes, ... in order for its kVec columns; the row
//                           lanes' partials are added by a fixed shared-memory tree. Each column
//                           is owned by one block, so there are no races and no atomics.
// Every sum is in a fixed order, so two runs give the same bits.
// NOTES: the dweight kernel has only ceil(C / 16) blocks (128 for C = 2048 on 132 SMs); a split
// over rows would need a workspace for the partials. For small C (per-head QK-norm, C = hd) it is
// latency-bound over many rows.
// NOTES: nothing is __restrict__ or read through the non-coherent cache: dx may alias dout or x
// (as on the CPU); each lane reads its own columns of a row before it writes them.
#include "moe/ops/cuda/norm.h"

#include <cstdint>
#include <initializer_list>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/element.cuh"
#include "moe/ops/cuda/rmsnorm_rows.cuh"

namespace moe::cuda {
namespace {

using namespace rmsnorm_rows;

constexpr int kDweightThreads = 1024;
constexpr int kDweightColumns = 16;  // columns per dweight block

// dx_j = rstd * w_j * g_j - x_j * rstd^3 * (1/C) * sum_c w_c g_c x_c (derivation in cpu/norm.cpp).
// x and dout of the first kCachedChunks accesses stay in registers; a lane reads its columns of
// x, dout (and dx) before it writes dx there, so dx may alias x or dout.
template <typename T, int kVec>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_dx_kernel(T* dx, const T* dout, const T* x, const T* weight, const float* rstd, bool accumulate_dx,
                      int64_t R, int64_t C) {
  using A = VecAccess<T, kVec>;
  using Raw = typename A::Raw;
  constexpr int kStride = 32 * kVec;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= R) return;
  const T* xr = x + r * C;
  const T* gr = dout + r * C;
  T* dxr = dx + r * C;
  Raw x_cached[kCachedChunks<kVec>] = {};
  Raw g_cached[kCachedChunks<kVec>] = {};
#pragma unroll
  for (int i = 0; i < kCachedChunks<kVec>; ++i) {
    const int64_t c = access_column<kVec>(i, lane);
    if (c < C) {
      x_cached[i] = A::load(xr + c);
      g_cached[i] = A::load(gr + c);
    }
  }
  float dot = 0.0f;
  auto add_dot = [&](int64_t c, Raw x_raw, Raw g_raw) {
    float xv[kVec], gv[kVec], wv[kVec];
    A::unpack(x_raw, xv);
    A::unpack(g_raw, gv);
    A::unpack(A::load(weight + c), wv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) dot += wv[j] * gv[j] * xv[j];
  };
#pragma unroll
  for (int i = 0; i < kCachedChunks<kVec>; ++i)
    if (access_column<kVec>(i, lane) < C) add_dot(access_column<kVec>(i, lane), x_cached[i], g_cached[i]);
  for (int64_t c = access_column<kVec>(kCachedChunks<kVec>, lane); c < C; c += kStride)
    add_dot(c, A::load(xr + c), A::load(gr + c));
  dot = warp_sum(dot);
  const float rs = rstd[r];
  const float coef = rs * rs * rs * dot / static_cast<float>(C);
  auto write = [&](int64_t c, Raw x_raw, Raw g_raw) {
    float xv[kVec], gv[kVec], wv[kVec], d[kVec];
    A::unpack(x_raw, xv);
    A::unpack(g_raw, gv);
    A::unpack(A::load(weight + c), wv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) d[j] = rs * wv[j] * gv[j] - xv[j] * coef;
    if (accumulate_dx) {
      float old[kVec];
      A::unpack(A::load(dxr + c), old);
#pragma unroll
      for (int j = 0; j < kVec; ++j) d[j] += old[j];
    }
    A::store(dxr + c, d);
  };
#pragma unroll
  for (int i = 0; i < kCachedChunks<kVec>; ++i)
    if (access_column<kVec>(i, lane) < C) write(access_column<kVec>(i, lane), x_cached[i], g_cached[i]);
  for (int64_t c = access_column<kVec>(kCachedChunks<kVec>, lane); c < C; c += kStride)
    write(c, A::load(xr + c), A::load(gr + c));
}

// blockDim = kDweightThreads = (kDweightColumns / kVec column lanes) x (row lanes), the column lane
// fastest; block b owns columns [16 b, 16 b + 16). Thread (row lane, column lane) sums rows
// row_lane, row_lane + row_lanes, ... in order, then the row lanes' partials are added by a fixed
// tree (row lane i takes i + s for s = row_lanes / 2, ..., 1), and dweight += the total.
template <typename T, int kVec>
__global__ void __launch_bounds__(kDweightThreads)
    rmsnorm_dweight_kernel(float* dweight, const T* dout, const T* x, const float* rstd, int64_t R, int64_t C) {
  using A = VecAccess<T, kVec>;
  constexpr int kColumnLanes = kDweightColumns / kVec;
  constexpr int kRowLanes = kDweightThreads / kColumnLanes;
  static_assert((kRowLanes & (kRowLanes - 1)) == 0, "the tree needs a power-of-two number of row lanes");
  __shared__ float partial[kRowLanes][kDweightColumns + 1];  // + 1: the tree's reads spread over banks
  const int column_lane = threadIdx.x % kColumnLanes;
  const int row_lane = threadIdx.x / kColumnLanes;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kDweightColumns + column_lane * kVec;
  float acc[kVec] = {};
  if (c < C) {
#pragma unroll 4
    for (int64_t r = row_lane; r < R; r += kRowLanes) {
      float gv[kVec], xv[kVec];
      A::unpack(A::load(dout + r * C + c), gv);
      A::unpack(A::load(x + r * C + c), xv);
      const float rs = rstd[r];
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] += gv[j] * xv[j] * rs;
    }
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j) partial[row_lane][column_lane * kVec + j] = acc[j];
  __syncthreads();
  for (int s = kRowLanes / 2; s > 0; s /= 2) {
    for (int e = threadIdx.x; e < s * kDweightColumns; e += kDweightThreads)
      partial[e / kDweightColumns][e % kDweightColumns] += partial[e / kDweightColumns + s][e % kDweightColumns];
    __syncthreads();
  }
  const int64_t column = static_cast<int64_t>(blockIdx.x) * kDweightColumns + threadIdx.x;
  if (threadIdx.x < kDweightColumns && column < C) dweight[column] += partial[0][threadIdx.x];
}

unsigned row_blocks(int64_t R) { return static_cast<unsigned>((R + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// The 16-byte path needs every row of every T tensor to start on 16 bytes: C a multiple of kVec
// and 16-byte aligned bases.
template <typename T>
bool vector_rows(int64_t C, std::initializer_list<const Tensor*> tensors) {
  if (C % kVecOf<T> != 0) return false;
  for (const Tensor* t : tensors)
    if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0) return false;
  return true;
}

template <typename T, int kVec>
void launch_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, int64_t R, int64_t C,
                    cudaStream_t s) {
  rmsnorm_forward_kernel<T, kVec><<<row_blocks(R), kRowThreads, 0, s>>>(
      StoreRows<T, kVec>{out.ptr<T>(), C}, rstd.ptr<float>(), x.ptr<const T>(), weight.ptr<const T>(), eps, R, C);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, int64_t R, int64_t C,
                    cudaStream_t s) {
  if (vector_rows<T>(C, {&out, &x, &weight}))
    launch_forward<T, kVecOf<T>>(out, rstd, x, weight, eps, R, C, s);
  else
    launch_forward<T, 1>(out, rstd, x, weight, eps, R, C, s);
}

template <typename T, int kVec>
void launch_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd, bool accumulate_dx,
                     int64_t R, int64_t C, cudaStream_t s) {
  // dweight first: it reads dout and x, so dx may alias either of them (as on the CPU).
  const unsigned dw_blocks = static_cast<unsigned>((C + kDweightColumns - 1) / kDweightColumns);
  rmsnorm_dweight_kernel<T, kVec><<<dw_blocks, kDweightThreads, 0, s>>>(
      dweight.ptr<float>(), dout.ptr<const T>(), x.ptr<const T>(), rstd.ptr<const float>(), R, C);
  CUDA_CHECK_LAUNCH();
  rmsnorm_dx_kernel<T, kVec><<<row_blocks(R), kRowThreads, 0, s>>>(dx.ptr<T>(), dout.ptr<const T>(),
                                                                   x.ptr<const T>(), weight.ptr<const T>(),
                                                                   rstd.ptr<const float>(), accumulate_dx, R, C);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd, bool accumulate_dx,
                     int64_t R, int64_t C, cudaStream_t s) {
  if (vector_rows<T>(C, {&dx, &dout, &x, &weight}))
    launch_backward<T, kVecOf<T>>(dx, dweight, dout, x, weight, rstd, accumulate_dx, R, C, s);
  else
    launch_backward<T, 1>(dx, dweight, dout, x, weight, rstd, accumulate_dx, R, C, s);
}

}  // namespace

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, Stream stream) {
  const int64_t C = weight.dim(0);
  const int64_t R = rstd.numel();
  if (R == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (x.dtype == DType::F32)
    launch_forward<float>(out, rstd, x, weight, eps, R, C, s);
  else
    launch_forward<__nv_bfloat16>(out, rstd, x, weight, eps, R, C, s);
}

void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd,
                      bool accumulate_dx, Stream stream) {
  const int64_t C = weight.dim(0);
  const int64_t R = rstd.numel();
  if (R == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (x.dtype == DType::F32)
    launch_backward<float>(dx, dweight, dout, x, weight, rstd, accumulate_dx, R, C, s);
  else
    launch_backward<__nv_bfloat16>(dx, dweight, dout, x, weight, rstd, accumulate_dx, R, C, s);
}

}  // namespace moe::cuda

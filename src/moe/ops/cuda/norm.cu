// CUDA RMSNorm over the last dimension (see moe/ops/cuda/norm.h for the dtype contract).
//
// Kernels:
//   rmsnorm_forward_kernel  one warp per row (8 rows per 256-thread block): the warp sums x^2
//                           (lanes stride over the columns, then a shuffle tree), and writes out.
//   rmsnorm_dx_kernel       one warp per row: dot = sum_c w_c g_c x_c the same way, then dx.
//   rmsnorm_dweight_kernel  one 32 x 32 block per chunk of 32 columns: thread (col, lane_y) sums
//                           rows lane_y, lane_y + 32, ... in order; the 32 partials of a column
//                           are then added in order by one thread. Each column is owned by one
//                           block, so there are no races and no atomics: deterministic.
// NOTES: the dweight kernel has only ceil(C / 32) blocks; for small C (per-head QK-norm, C = hd)
// it is latency-bound over many rows. Correct first; a faster split needs a workspace.
#include "moe/ops/cuda/norm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/element.cuh"

namespace moe::cuda {
namespace {


__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

constexpr int kWarpsPerBlock = 8;
constexpr int kRowThreads = 32 * kWarpsPerBlock;
constexpr int kDweightRowLanes = 32;  // threads along the rows in the dweight kernel

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_forward_kernel(T* out, float* rstd, const T* x, const T* weight, float eps, int64_t R, int64_t C) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= R) return;  // whole warps leave together
  const T* xr = x + r * C;
  float sum_sq = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float v = to_f32(xr[c]);
    sum_sq += v * v;
  }
  sum_sq = warp_sum(sum_sq);
  const float rs = 1.0f / sqrtf(sum_sq / static_cast<float>(C) + eps);
  if (lane == 0) rstd[r] = rs;
  T* yr = out + r * C;
  for (int64_t c = lane; c < C; c += 32) yr[c] = from_f32<T>(to_f32(xr[c]) * rs * to_f32(weight[c]));
}

// dx_j = rstd * w_j * g_j - x_j * rstd^3 * (1/C) * sum_c w_c g_c x_c (derivation in cpu/norm.cpp).
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_dx_kernel(T* dx, const T* dout, const T* x, const T* weight, const float* rstd, bool accumulate_dx,
                      int64_t R, int64_t C) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= R) return;
  const T* xr = x + r * C;
  const T* gr = dout + r * C;
  float dot = 0.0f;
  for (int64_t c = lane; c < C; c += 32) dot += to_f32(weight[c]) * to_f32(gr[c]) * to_f32(xr[c]);
  dot = warp_sum(dot);
  const float rs = rstd[r];
  const float coef = rs * rs * rs * dot / static_cast<float>(C);
  T* dxr = dx + r * C;
  for (int64_t c = lane; c < C; c += 32) {
    float d = rs * to_f32(weight[c]) * to_f32(gr[c]) - to_f32(xr[c]) * coef;
    if (accumulate_dx) d += to_f32(dxr[c]);
    dxr[c] = from_f32<T>(d);
  }
}

// blockDim = (32 columns, kDweightRowLanes row lanes); block b owns columns [32 b, 32 b + 32).
template <typename T>
__global__ void __launch_bounds__(32 * kDweightRowLanes)
    rmsnorm_dweight_kernel(float* dweight, const T* dout, const T* x, const float* rstd, int64_t R, int64_t C) {
  __shared__ float partial[kDweightRowLanes][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (c < C) {
    for (int64_t r = threadIdx.y; r < R; r += kDweightRowLanes)
      acc += to_f32(dout[r * C + c]) * to_f32(x[r * C + c]) * rstd[r];
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sum = 0.0f;
    for (int i = 0; i < kDweightRowLanes; ++i) sum += partial[i][threadIdx.x];
    dweight[c] += sum;
  }
}

void check_cuda(const char* op, const char* name, const Tensor& t) {
  MOE_CHECK(t.device == Device::CUDA, op, ": tensor ", name, " is not on the CUDA device");
}

void check_f32(const char* op, const char* name, const Tensor& t) {
  check_cuda(op, name, t);
  MOE_CHECK(t.dtype == DType::F32, op, ": tensor ", name, " must be F32, got ", dtype_name(t.dtype));
}

// Checks that t is on the device with dtype T of the call (the dtype of x, F32 or BF16).
void check_t(const char* op, const char* name, const Tensor& t, DType want) {
  check_cuda(op, name, t);
  MOE_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, op, ": tensor ", name, " must be F32 or BF16, got ",
            dtype_name(t.dtype));
  MOE_CHECK(t.dtype == want, op, ": tensor ", name, " has dtype ", dtype_name(t.dtype), " but x has ",
            dtype_name(want), " (one dtype per call)");
}

// Checks the shapes shared by forward and backward and returns the row count R (x is [R, C]).
int64_t check_rows(const char* op, const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  MOE_CHECK(weight.ndim() == 1, op, ": weight must be 1-D [C], got ", weight.shape.str());
  const int64_t C = weight.dim(0);
  MOE_CHECK(x.ndim() >= 1 && x.dim(-1) == C, op, ": x ", x.shape.str(), " must end in C = ", C,
            " (the weight length)");
  const int64_t R = C == 0 ? 0 : x.numel() / C;
  MOE_CHECK(rstd.numel() == R, op, ": rstd has ", rstd.numel(), " elements, expected one per row (", R, ")");
  return R;
}

unsigned row_blocks(int64_t R) { return static_cast<unsigned>((R + kWarpsPerBlock - 1) / kWarpsPerBlock); }

template <typename T>
void launch_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, int64_t R, int64_t C,
                    cudaStream_t s) {
  rmsnorm_forward_kernel<T><<<row_blocks(R), kRowThreads, 0, s>>>(out.ptr<T>(), rstd.ptr<float>(), x.ptr<const T>(),
                                                                  weight.ptr<const T>(), eps, R, C);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd, bool accumulate_dx,
                     int64_t R, int64_t C, cudaStream_t s) {
  // dweight first: it reads dout and x, so dx may alias either of them (as on the CPU).
  const dim3 dw_block(32, kDweightRowLanes);
  const unsigned dw_blocks = static_cast<unsigned>((C + 31) / 32);
  rmsnorm_dweight_kernel<T><<<dw_blocks, dw_block, 0, s>>>(dweight.ptr<float>(), dout.ptr<const T>(), x.ptr<const T>(),
                                                           rstd.ptr<const float>(), R, C);
  CUDA_CHECK_LAUNCH();
  rmsnorm_dx_kernel<T><<<row_blocks(R), kRowThreads, 0, s>>>(dx.ptr<T>(), dout.ptr<const T>(), x.ptr<const T>(),
                                                             weight.ptr<const T>(), rstd.ptr<const float>(),
                                                             accumulate_dx, R, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, Stream stream) {
  const char* op = "rmsnorm_forward";
  check_t(op, "x", x, x.dtype);
  check_t(op, "weight", weight, x.dtype);
  check_t(op, "out", out, x.dtype);
  check_f32(op, "rstd", rstd);
  const int64_t R = check_rows(op, x, weight, rstd);
  const int64_t C = weight.dim(0);
  MOE_CHECK(out.shape == x.shape, op, ": out ", out.shape.str(), " must match x ", x.shape.str());
  if (R == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (x.dtype == DType::F32)
    launch_forward<float>(out, rstd, x, weight, eps, R, C, s);
  else
    launch_forward<__nv_bfloat16>(out, rstd, x, weight, eps, R, C, s);
}

void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd,
                      bool accumulate_dx, Stream stream) {
  const char* op = "rmsnorm_backward";
  check_t(op, "x", x, x.dtype);
  check_t(op, "weight", weight, x.dtype);
  check_t(op, "dout", dout, x.dtype);
  check_t(op, "dx", dx, x.dtype);
  check_f32(op, "rstd", rstd);
  check_f32(op, "dweight", dweight);
  const int64_t R = check_rows(op, x, weight, rstd);
  const int64_t C = weight.dim(0);
  MOE_CHECK(dx.shape == x.shape, op, ": dx ", dx.shape.str(), " must match x ", x.shape.str());
  MOE_CHECK(dout.shape == x.shape, op, ": dout ", dout.shape.str(), " must match x ", x.shape.str());
  MOE_CHECK(dweight.shape == weight.shape, op, ": dweight ", dweight.shape.str(), " must match weight ",
            weight.shape.str());
  if (R == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (x.dtype == DType::F32)
    launch_backward<float>(dx, dweight, dout, x, weight, rstd, accumulate_dx, R, C, s);
  else
    launch_backward<__nv_bfloat16>(dx, dweight, dout, x, weight, rstd, accumulate_dx, R, C, s);
}

}  // namespace moe::cuda

// CUDA element-wise helpers (see moe/ops/elementwise.h and moe/ops/cuda/elementwise.h for the dtype
// contract).
//
// Kernels:
//   add_inplace_kernel         one thread per element, grid-stride, sum in FP32.
//   cast_kernel                one thread per element, grid-stride.
//   accumulate_scalars_kernel  one thread applies up to kMaxScalarTerms terms, passed by value in
//                              the kernel's parameters, in order.
// fill_zero and copy (and cast_copy between equal dtypes) are cudaMemsetAsync/cudaMemcpyAsync.
#include "moe/ops/cuda/elementwise.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/element.cuh"

namespace moe::cuda {
namespace {


constexpr int kThreads = 256;
constexpr int kMaxScalarTerms = 64;  // accumulate_scalars terms per launch (24 bytes each)

unsigned grid_for(int64_t n) { return grid_stride_blocks(n, kThreads); }

#define MOE_GRID_STRIDE(idx, n)                                                                 \
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < (n); \
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void __launch_bounds__(kThreads) add_inplace_kernel(T* y, const T* x, int64_t n) {
  MOE_GRID_STRIDE(i, n) { y[i] = from_f32<T>(to_f32(y[i]) + to_f32(x[i])); }
}

__global__ void __launch_bounds__(kThreads) cast_f32_to_bf16_kernel(__nv_bfloat16* dst, const float* src, int64_t n) {
  MOE_GRID_STRIDE(i, n) { dst[i] = f32_to_bf16_bits(src[i]); }
}

__global__ void __launch_bounds__(kThreads) cast_bf16_to_f32_kernel(float* dst, const __nv_bfloat16* src, int64_t n) {
  MOE_GRID_STRIDE(i, n) { dst[i] = __bfloat162float(src[i]); }
}

// One term of accumulate_scalars as the kernel sees it: the address of the element, not the tensor.
struct ScalarTermArg {
  const void* value;  // src's element `index`: an int32_t when is_int, else a float
  int64_t slot;
  float scale;
  int is_int;
};

struct ScalarTermBatch {
  ScalarTermArg terms[kMaxScalarTerms];
  int count;
};

// A single thread, terms in order. __fmul_rn/__fadd_rn keep the product and the sum separately
// rounded (no fused multiply-add), as on the CPU. No restrict: a term's src may be stats itself.
__global__ void accumulate_scalars_kernel(float* stats, const ScalarTermBatch batch) {
  for (int i = 0; i < batch.count; ++i) {
    const ScalarTermArg& term = batch.terms[i];
    const float value = term.is_int ? static_cast<float>(*static_cast<const int32_t*>(term.value))
                                    : *static_cast<const float*>(term.value);
    stats[term.slot] = __fadd_rn(stats[term.slot], __fmul_rn(term.scale, value));
  }
}

#undef MOE_GRID_STRIDE

}  // namespace

void add_inplace(Tensor y, Tensor x, Stream stream) {
  const int64_t n = y.numel();
  if (n == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (y.dtype == DType::F32)
    add_inplace_kernel<float><<<grid_for(n), kThreads, 0, s>>>(y.ptr<float>(), x.ptr<const float>(), n);
  else
    add_inplace_kernel<__nv_bfloat16>
        <<<grid_for(n), kThreads, 0, s>>>(y.ptr<__nv_bfloat16>(), x.ptr<const __nv_bfloat16>(), n);
  CUDA_CHECK_LAUNCH();
}

void fill_zero(Tensor y, Stream stream) {
  if (y.nbytes() > 0) CUDA_CHECK(cudaMemsetAsync(y.data, 0, y.nbytes(), cuda_stream(stream)));
}

void copy(Tensor dst, Tensor src, Stream stream) {
  if (dst.nbytes() > 0 && dst.data != src.data)
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.nbytes(), cudaMemcpyDeviceToDevice,
                               cuda_stream(stream)));
}

void cast_copy(Tensor dst, Tensor src, Stream stream) {
  if (dst.dtype == src.dtype) return cuda::copy(dst, src, stream);  // qualified: moe::copy is visible too
  const int64_t n = dst.numel();
  if (n == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (dst.dtype == DType::BF16)
    cast_f32_to_bf16_kernel<<<grid_for(n), kThreads, 0, s>>>(dst.ptr<__nv_bfloat16>(), src.ptr<const float>(), n);
  else
    cast_bf16_to_f32_kernel<<<grid_for(n), kThreads, 0, s>>>(dst.ptr<float>(), src.ptr<const __nv_bfloat16>(), n);
  CUDA_CHECK_LAUNCH();
}

void accumulate_scalars(Tensor stats, const std::vector<ScalarTerm>& terms, Stream stream) {
  const cudaStream_t s = cuda_stream(stream);
  for (size_t first = 0; first < terms.size(); first += kMaxScalarTerms) {
    ScalarTermBatch batch{};
    batch.count = static_cast<int>(std::min<size_t>(terms.size() - first, kMaxScalarTerms));
    for (int i = 0; i < batch.count; ++i) {
      const ScalarTerm& term = terms[first + i];
      const char* element =
          static_cast<const char*>(term.src.data) + static_cast<size_t>(term.index) * dtype_size(term.src.dtype);
      batch.terms[i] = {element, term.slot, term.scale, term.src.dtype == DType::I32 ? 1 : 0};
    }
    accumulate_scalars_kernel<<<1, 1, 0, s>>>(stats.ptr<float>(), batch);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace moe::cuda

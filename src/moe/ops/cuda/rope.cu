// CUDA rotary position embedding, rotate-half convention (see moe/ops/rope.h and
// moe/ops/cuda/rope.h for the dtype contract).
//
// Kernel: one thread per (row, pair index i < hd/2), grid-stride. The thread computes the angle
// pos * theta^(-2i/hd) and its cos/sin in double (rounded to FP32 once, exactly as the CPU op
// does) and rotates pair i of every head of its row. Consecutive threads take consecutive i, so a
// warp reads and writes contiguous elements of one head half.
// NOTES: double pow/sincos per (row, i) is the simple way to match the CPU to FP32 at positions
// in the thousands (an FP32 angle is off by ~pos * 2^-24 rad); a cos/sin table would be faster.
#include "moe/ops/cuda/rope.h"

#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/element.cuh"

namespace moe::cuda {
namespace {


constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 16;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(T* x, int64_t rows, int64_t seq_len, int64_t n_heads, int64_t hd, double theta, double sign) {
  const int64_t half = hd / 2;
  const int64_t width = n_heads * hd;
  const int64_t total = rows * half;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / half;
    const int64_t i = idx % half;
    const double pos = static_cast<double>(r % seq_len);
    const double inv_freq = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
    double sin_d, cos_d;
    sincos(pos * inv_freq, &sin_d, &cos_d);
    const float cs = static_cast<float>(cos_d);
    const float sn = static_cast<float>(sign * sin_d);
    T* xr = x + r * width;
    for (int64_t h = 0; h < n_heads; ++h) {
      T* head = xr + h * hd;
      const float a = to_f32(head[i]), b = to_f32(head[i + half]);
      // [a, b] -> [a cos - b sin, b cos + a sin]: out = x * cos + rotate_half(x) * sin.
      head[i] = from_f32<T>(a * cs - b * sn);
      head[i + half] = from_f32<T>(b * cs + a * sn);
    }
  }
}

void rope_rotate(const char* op, Tensor x, int64_t seq_len, int64_t n_heads, float theta, bool inverse,
                 Stream stream) {
  MOE_CHECK(x.device == Device::CUDA, op, ": tensor x is not on the CUDA device");
  MOE_CHECK(x.dtype == DType::F32 || x.dtype == DType::BF16, op, ": tensor x must be F32 or BF16, got ",
            dtype_name(x.dtype));
  MOE_CHECK(x.ndim() == 2, op, ": x must be 2-D [B*T, H*hd], got ", x.shape.str());
  MOE_CHECK(seq_len > 0, op, ": seq_len must be positive, got ", seq_len);
  MOE_CHECK(n_heads > 0 && x.dim(1) % n_heads == 0, op, ": row width ", x.dim(1), " is not a multiple of n_heads ",
            n_heads);
  const int64_t hd = x.dim(1) / n_heads;
  MOE_CHECK(hd % 2 == 0, op, ": head dim ", hd, " must be even");
  MOE_CHECK(x.dim(0) % seq_len == 0, op, ": ", x.dim(0), " rows are not a whole number of sequences of ",
            seq_len);
  MOE_CHECK(theta > 0.0f, op, ": theta must be positive, got ", theta);
  const int64_t rows = x.dim(0);
  const int64_t total = rows * (hd / 2);
  if (total == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks));
  const cudaStream_t s = cuda_stream(stream);
  const double sign = inverse ? -1.0 : 1.0;
  if (x.dtype == DType::F32)
    rope_kernel<float><<<blocks, kThreads, 0, s>>>(x.ptr<float>(), rows, seq_len, n_heads, hd, theta, sign);
  else
    rope_kernel<__nv_bfloat16>
        <<<blocks, kThreads, 0, s>>>(x.ptr<__nv_bfloat16>(), rows, seq_len, n_heads, hd, theta, sign);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(Tensor x, int64_t seq_len, int64_t n_heads, float theta, Stream stream) {
  rope_rotate("rope_forward", x, seq_len, n_heads, theta, /*inverse=*/false, stream);
}

void rope_backward(Tensor dx, int64_t seq_len, int64_t n_heads, float theta, Stream stream) {
  rope_rotate("rope_backward", dx, seq_len, n_heads, theta, /*inverse=*/true, stream);
}

}  // namespace moe::cuda

// CUDA rotary position embedding, rotate-half convention (see moe/ops/rope.h and
// moe/ops/cuda/rope.h for the dtype contract).
//
// Kernel: one thread per (row, group of V pair indices i < hd/2; V = 8 BF16 or 4 F32 when a head
// half is a whole number of 16-byte words, else 1), grid-stride. The thread computes the angles
// pos * theta^(-2i/hd) and their cos/sin in double (rounded to FP32 once, exactly as the CPU op
// does) and rotates its pairs in every head of its row. Consecutive threads take consecutive
// groups, so a warp reads and writes contiguous words of one head half.
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

constexpr int kHeadBatch = 4;  // heads whose loads a thread issues together

// Thread item (r, g): pairs i in [g V, g V + V) of row r, in every head; each half of a head moves
// as one V-element word (V = 1: one element), kHeadBatch heads' words loaded before any is rotated
// (one 2-byte load in flight per thread kept this kernel at a third of HBM bandwidth).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(T* x, int64_t rows, int64_t seq_len, int64_t n_heads, int64_t hd, double theta, double sign) {
  using P = Pack<T, V>;
  const int64_t half = hd / 2, groups = half / V;
  const int64_t width = n_heads * hd;
  const int64_t total = rows * groups;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / groups;
    const int64_t i0 = idx % groups * V;
    const double pos = static_cast<double>(r % seq_len);
    float cs[V], sn[V];
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const double inv_freq = pow(theta, -2.0 * static_cast<double>(i0 + u) / static_cast<double>(hd));
      double sin_d, cos_d;
      sincos(pos * inv_freq, &sin_d, &cos_d);
      cs[u] = static_cast<float>(cos_d);
      sn[u] = static_cast<float>(sign * sin_d);
    }
    T* xr = x + r * width + i0;
    for (int64_t h0 = 0; h0 < n_heads; h0 += kHeadBatch) {
      P a[kHeadBatch], b[kHeadBatch];
#pragma unroll
      for (int j = 0; j < kHeadBatch; ++j) {
        if (h0 + j >= n_heads) break;
        a[j] = *reinterpret_cast<const P*>(xr + (h0 + j) * hd);
        b[j] = *reinterpret_cast<const P*>(xr + (h0 + j) * hd + half);
      }
#pragma unroll
      for (int j = 0; j < kHeadBatch; ++j) {
        if (h0 + j >= n_heads) break;
        P oa, ob;
#pragma unroll
        for (int u = 0; u < V; ++u) {
          const float av = to_f32(a[j].e[u]), bv = to_f32(b[j].e[u]);
          // [a, b] -> [a cos - b sin, b cos + a sin]: out = x * cos + rotate_half(x) * sin. Rounded
          // intrinsics: nothing fused into an FMA, the CPU's operations in its order.
          oa.e[u] = from_f32<T>(__fsub_rn(__fmul_rn(av, cs[u]), __fmul_rn(bv, sn[u])));
          ob.e[u] = from_f32<T>(__fadd_rn(__fmul_rn(bv, cs[u]), __fmul_rn(av, sn[u])));
        }
        *reinterpret_cast<P*>(xr + (h0 + j) * hd) = oa;
        *reinterpret_cast<P*>(xr + (h0 + j) * hd + half) = ob;
      }
    }
  }
}

void rope_rotate(Tensor x, int64_t seq_len, int64_t n_heads, float theta, bool inverse, Stream stream) {
  const int64_t hd = x.dim(1) / n_heads;
  const int64_t rows = x.dim(0);
  if (rows == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  const double sign = inverse ? -1.0 : 1.0;
  // 16-byte words when a head half is a whole number of them (the row base then aligns every word).
  with_vec_width(x.dtype, hd / 2, {x.data}, [&](auto vec_type) {
    using T = typename decltype(vec_type)::elem;
    constexpr int V = decltype(vec_type)::width;
    const int64_t total = rows * (hd / 2 / V);
    if (total == 0) return;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks));
    rope_kernel<T, V><<<blocks, kThreads, 0, s>>>(static_cast<T*>(x.data), rows, seq_len, n_heads, hd, theta, sign);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(Tensor x, int64_t seq_len, int64_t n_heads, float theta, Stream stream) {
  rope_rotate(x, seq_len, n_heads, theta, /*inverse=*/false, stream);
}

void rope_backward(Tensor dx, int64_t seq_len, int64_t n_heads, float theta, Stream stream) {
  rope_rotate(dx, seq_len, n_heads, theta, /*inverse=*/true, stream);
}

}  // namespace moe::cuda

// CUDA SwiGLU on the fused [gate | up] projection output (see moe/ops/activation.h and
// moe/ops/cuda/activation.h for the dtype contract).
//
// Kernels: one thread per 16-byte word of the output [R, H] (8 BF16 or 4 F32 columns; one element
// where H or a pointer does not allow it), grid-stride; gate g = gate_up[r, j], up
// u = gate_up[r, H + j]. Element-wise, so trivially deterministic, and the same bits at any width.
#include "moe/ops/cuda/activation.h"

#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/element.cuh"
#include "moe/ops/cuda/swiglu_math.cuh"

namespace moe::cuda {
namespace {


constexpr int kThreads = 256;

// Thread item (r, c): columns [c V, c V + V) of row r, moved as one V-element word (V = 1: one
// element). The arithmetic per element does not depend on V.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) swiglu_forward_kernel(T* out, const T* gate_up, int64_t R, int64_t H) {
  using P = Pack<T, V>;
  const int64_t words = H / V, n = R * words;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / words, c = idx % words;
    const P g = reinterpret_cast<const P*>(gate_up + r * 2 * H)[c];
    const P u = reinterpret_cast<const P*>(gate_up + r * 2 * H + H)[c];
    P o;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float gf = to_f32(g.e[e]);
      o.e[e] = from_f32<T>(swiglu_value(gf, swiglu_sigmoid<T>(gf), to_f32(u.e[e])));
    }
    reinterpret_cast<P*>(out + r * H)[c] = o;
  }
}

// The arithmetic: swiglu_math.cuh. kWithOutput: also writes the forward output,
// computed as swiglu_forward_kernel computes it, (g s) u, so its bits are the forward's.
template <typename T, int V, bool kWithOutput>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(T* dgate_up, T* out, const T* dout, const T* gate_up, int64_t R, int64_t H) {
  using P = Pack<T, V>;
  const int64_t words = H / V, n = R * words;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / words, c = idx % words;
    // Every input is read before either output is written: dgate_up may alias gate_up.
    const P g = reinterpret_cast<const P*>(gate_up + r * 2 * H)[c];
    const P u = reinterpret_cast<const P*>(gate_up + r * 2 * H + H)[c];
    const P dy = reinterpret_cast<const P*>(dout + r * H)[c];
    P dg, du, o;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float gf = to_f32(g.e[e]), uf = to_f32(u.e[e]), d = to_f32(dy.e[e]);
      const float s = swiglu_sigmoid<T>(gf);
      if constexpr (kWithOutput) o.e[e] = from_f32<T>(swiglu_value(gf, s, uf));
      du.e[e] = from_f32<T>(swiglu_grad_up(d, gf, s));
      dg.e[e] = from_f32<T>(swiglu_grad_gate(d, gf, s, uf));
    }
    if constexpr (kWithOutput) reinterpret_cast<P*>(out + r * H)[c] = o;
    reinterpret_cast<P*>(dgate_up + r * 2 * H + H)[c] = du;
    reinterpret_cast<P*>(dgate_up + r * 2 * H)[c] = dg;
  }
}

unsigned grid_for(int64_t n) { return grid_stride_blocks(n, kThreads); }

}  // namespace

void swiglu_forward(Tensor out, Tensor gate_up, Stream stream) {
  const int64_t R = out.dim(0), H = out.dim(1);
  if (R * H == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  with_vec_width(gate_up.dtype, H, {out.data, gate_up.data}, [&](auto vec_type) {
    using T = typename decltype(vec_type)::elem;
    constexpr int V = decltype(vec_type)::width;
    swiglu_forward_kernel<T, V><<<grid_for(R * H / V), kThreads, 0, s>>>(static_cast<T*>(out.data),
                                                                        static_cast<const T*>(gate_up.data), R, H);
  });
  CUDA_CHECK_LAUNCH();
}

namespace {

template <bool kWithOutput>
void launch_swiglu_backward(Tensor dgate_up, Tensor out, Tensor dout, Tensor gate_up, Stream stream) {
  const int64_t R = dout.dim(0), H = dout.dim(1);
  if (R * H == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  // out.data is null without kWithOutput (aligned: it does not narrow the width).
  with_vec_width(gate_up.dtype, H, {dgate_up.data, out.data, dout.data, gate_up.data}, [&](auto vec_type) {
    using T = typename decltype(vec_type)::elem;
    constexpr int V = decltype(vec_type)::width;
    swiglu_backward_kernel<T, V, kWithOutput><<<grid_for(R * H / V), kThreads, 0, s>>>(
        static_cast<T*>(dgate_up.data), static_cast<T*>(out.data), static_cast<const T*>(dout.data),
        static_cast<const T*>(gate_up.data), R, H);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, Stream stream) {
  launch_swiglu_backward<false>(dgate_up, Tensor(), dout, gate_up, stream);
}

void swiglu_backward_with_output(Tensor dgate_up, Tensor out, Tensor dout, Tensor gate_up, Stream stream) {
  launch_swiglu_backward<true>(dgate_up, out, dout, gate_up, stream);
}

}  // namespace moe::cuda

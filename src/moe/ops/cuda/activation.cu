// CUDA SwiGLU on the fused [gate | up] projection output (see moe/ops/activation.h and
// moe/ops/cuda/activation.h for the dtype contract).
//
// Kernels: one thread per output element (r, j) of [R, H], grid-stride; gate g = gate_up[r, j],
// up u = gate_up[r, H + j]. Element-wise, so trivially deterministic.
#include "moe/ops/cuda/activation.h"

#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/element.cuh"

namespace moe::cuda {
namespace {


constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 16;

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <typename T>
__global__ void __launch_bounds__(kThreads) swiglu_forward_kernel(T* out, const T* gate_up, int64_t R, int64_t H) {
  const int64_t n = R * H;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / H, j = idx % H;
    const float g = to_f32(gate_up[r * 2 * H + j]);
    const float u = to_f32(gate_up[r * 2 * H + H + j]);
    out[idx] = from_f32<T>(g * sigmoid(g) * u);
  }
}

// d silu(g) / dg = s (1 + g (1 - s)), s = sigmoid(g).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(T* dgate_up, const T* dout, const T* gate_up, int64_t R, int64_t H) {
  const int64_t n = R * H;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / H, j = idx % H;
    const int64_t gi = r * 2 * H + j, ui = gi + H;
    const float g = to_f32(gate_up[gi]);
    const float u = to_f32(gate_up[ui]);
    const float dy = to_f32(dout[idx]);
    const float s = sigmoid(g);
    // Both inputs are read before either output is written: dgate_up may alias gate_up.
    dgate_up[ui] = from_f32<T>(dy * g * s);
    dgate_up[gi] = from_f32<T>(dy * u * s * (1.0f + g * (1.0f - s)));
  }
}

// Checks device, 2-D shape, and the dtype T of the call (F32 or BF16, the same for every tensor).
void check_t(const char* op, const char* name, const Tensor& t, DType want) {
  MOE_CHECK(t.device == Device::CUDA, op, ": tensor ", name, " is not on the CUDA device");
  MOE_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, op, ": tensor ", name, " must be F32 or BF16, got ",
            dtype_name(t.dtype));
  MOE_CHECK(t.dtype == want, op, ": tensor ", name, " has dtype ", dtype_name(t.dtype), " but gate_up has ",
            dtype_name(want), " (one dtype per call)");
  MOE_CHECK(t.ndim() == 2, op, ": tensor ", name, " must be 2-D, got ", t.shape.str());
}

unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

}  // namespace

void swiglu_forward(Tensor out, Tensor gate_up, Stream stream) {
  const char* op = "swiglu_forward";
  check_t(op, "gate_up", gate_up, gate_up.dtype);
  check_t(op, "out", out, gate_up.dtype);
  const int64_t R = out.dim(0), H = out.dim(1);
  MOE_CHECK(gate_up.dim(0) == R && gate_up.dim(1) == 2 * H, op, ": gate_up ", gate_up.shape.str(),
            " must be [R, 2H] for out ", out.shape.str());
  if (R * H == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (gate_up.dtype == DType::F32)
    swiglu_forward_kernel<float><<<grid_for(R * H), kThreads, 0, s>>>(out.ptr<float>(), gate_up.ptr<const float>(), R, H);
  else
    swiglu_forward_kernel<__nv_bfloat16><<<grid_for(R * H), kThreads, 0, s>>>(
        out.ptr<__nv_bfloat16>(), gate_up.ptr<const __nv_bfloat16>(), R, H);
  CUDA_CHECK_LAUNCH();
}

void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, Stream stream) {
  const char* op = "swiglu_backward";
  check_t(op, "gate_up", gate_up, gate_up.dtype);
  check_t(op, "dout", dout, gate_up.dtype);
  check_t(op, "dgate_up", dgate_up, gate_up.dtype);
  const int64_t R = dout.dim(0), H = dout.dim(1);
  MOE_CHECK(gate_up.dim(0) == R && gate_up.dim(1) == 2 * H, op, ": gate_up ", gate_up.shape.str(),
            " must be [R, 2H] for dout ", dout.shape.str());
  MOE_CHECK(dgate_up.shape == gate_up.shape, op, ": dgate_up ", dgate_up.shape.str(), " must match gate_up ",
            gate_up.shape.str());
  if (R * H == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (gate_up.dtype == DType::F32)
    swiglu_backward_kernel<float><<<grid_for(R * H), kThreads, 0, s>>>(
        dgate_up.ptr<float>(), dout.ptr<const float>(), gate_up.ptr<const float>(), R, H);
  else
    swiglu_backward_kernel<__nv_bfloat16><<<grid_for(R * H), kThreads, 0, s>>>(
        dgate_up.ptr<__nv_bfloat16>(), dout.ptr<const __nv_bfloat16>(), gate_up.ptr<const __nv_bfloat16>(), R, H);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda

// The SwiGLU forward that quantizes its output as it produces it and stores it too
// (moe/ops/fp8_swiglu.h, fp8_swiglu_forward): the Rows quantizer of fp8_tiles.cuh with a Source that
// computes the SwiGLU values (rounded to the activation type, with swiglu_math.cuh's arithmetic) and
// stores them, instead of reading them. The codes and scales are bit for bit those of the plain
// SwiGLU kernel (activation.cu) followed by the plain quantizer, without reading the output back.
// The kernels that write only FP8 (both layouts, forward and backward): fp8_swiglu_staged.cu.
#include "moe/ops/cuda/fp8_swiglu.h"

#include "moe/ops/cuda/fp8_tiles.cuh"
#include "moe/ops/cuda/swiglu_math.cuh"

namespace moe::cuda {
namespace {

using namespace fp8_tiles;

// Rows source: the SwiGLU output out [R, H] = silu(g) u of gate_up [R, 2H], stored to out as it is
// produced. vector: 16-byte accesses of gate_up and out are aligned.
template <typename T>
struct SwigluForwardRows {
  const T* gate_up = nullptr;
  T* out = nullptr;
  int64_t H = 0;
  template <int kVec>
  __device__ __forceinline__ void load(int64_t row, int64_t col, int valid, bool vector, float (&v)[kVec]) const {
    float g[kVec], u[kVec];
    const T* gate = gate_up + row * 2 * H + col;
    load_run<T, kVec>(gate, valid, vector, g);
    load_run<T, kVec>(gate + H, valid, vector, u);
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = to_f32(from_f32<T>(swiglu_value(g[e], swiglu_sigmoid<T>(g[e]), u[e])));
    T* o = out + row * H + col;
    if (vector && valid == kVec) {
      VecAccess<T, kVec>::store(o, v);
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        if (e < valid) o[e] = from_f32<T>(v[e]);
    }
  }
};

int64_t rows_of(const Tensor& t) { return t.numel() / t.dim(-1); }

template <typename T>
void launch_forward(const Tensor& out, const Fp8Tensor& out_rows, const Tensor& gate_up, cudaStream_t s) {
  const int64_t R = rows_of(out), H = out.dim(-1);
  const bool vector = aligned(gate_up.data, 16) && aligned(out.data, 16) && H % (16 / sizeof(T)) == 0;
  launch_rows<T>(out_rows, SwigluForwardRows<T>{gate_up.ptr<const T>(), out.ptr<T>(), H}, R, H, vector, s);
}

}  // namespace

void fp8_swiglu_forward(Tensor out, Fp8Tensor out_rows, Tensor gate_up, Stream stream) {
  if (out.numel() == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (out.dtype == DType::BF16)
    launch_forward<__nv_bfloat16>(out, out_rows, gate_up, s);
  else
    launch_forward<float>(out, out_rows, gate_up, s);
}

}  // namespace moe::cuda

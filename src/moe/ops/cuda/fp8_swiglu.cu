// The SwiGLU forwards that quantize their output as they produce it (moe/ops/fp8_swiglu.h): the Rows
// quantizer of fp8_tiles.cuh with a Source that computes the SwiGLU values (rounded to the
// activation type, with swiglu_math.cuh's arithmetic) and stores them, instead of reading them; and
// its columns kernel (both layouts, one block per 128 x 128 tile) with a Source that computes them
// and stores nothing. The codes and scales are bit for bit those of the plain SwiGLU kernel
// (activation.cu) followed by the plain quantizer, without reading the output back.
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
    for (int e = 0; e < kVec; ++e) v[e] = to_f32(from_f32<T>(swiglu_value(g[e], swiglu_sigmoid(g[e]), u[e])));
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

// Columns source (with the Rows output: the columns kernel of fp8_tiles.cuh): features kw ..
// kw + features - 1 of SwiGLU output row `row`, from its gate and up runs, rounded to T as the
// stored output would be. Nothing is stored. vector: 16-byte loads of both runs are aligned.
template <typename T>
struct SwigluForwardColumns {
  const T* gate_up = nullptr;
  int64_t H = 0;
  __device__ __forceinline__ void load(Run16<T>& run, int64_t row, int64_t kw, int features, bool vector) const {
    Run16<T> gate, up;
    const T* g = gate_up + row * 2 * H + kw;
    gate.load(g, features, vector);
    up.load(g + H, features, vector);
#pragma unroll
    for (int f = 0; f < kRun; ++f) {
      if (f >= features) continue;
      const float x = gate.get(f);
      run.set(f, swiglu_value(x, swiglu_sigmoid(x), up.get(f)));
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

template <typename T>
void launch_rows_and_columns(const Fp8Tensor& out_rows, const Fp8Tensor& out_columns, const Tensor& gate_up,
                             const Tensor& offsets, cudaStream_t s) {
  const int64_t R = gate_up.dim(0), H = gate_up.dim(1) / 2, Mp = out_columns.codes.dim(-1);
  const bool vector = H % (16 / sizeof(T)) == 0 && aligned(gate_up.data, 16);
  launch_columns<T>(out_columns, SwigluForwardColumns<T>{gate_up.ptr<const T>(), H}, offsets, R, H, Mp, vector,
                    &out_rows, "fp8_swiglu_forward_rows_and_columns", s);
}

}  // namespace

void fp8_swiglu_forward_rows_and_columns(Fp8Tensor out_rows, Fp8Tensor out_columns, Tensor gate_up, Tensor offsets,
                                         Stream stream) {
  if (gate_up.dim(1) == 0 || out_columns.codes.dim(-1) == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (gate_up.dtype == DType::BF16)
    launch_rows_and_columns<__nv_bfloat16>(out_rows, out_columns, gate_up, offsets, s);
  else
    launch_rows_and_columns<float>(out_rows, out_columns, gate_up, offsets, s);
}

void fp8_swiglu_forward(Tensor out, Fp8Tensor out_rows, Tensor gate_up, Stream stream) {
  if (out.numel() == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (out.dtype == DType::BF16)
    launch_forward<__nv_bfloat16>(out, out_rows, gate_up, s);
  else
    launch_forward<float>(out, out_rows, gate_up, s);
}

}  // namespace moe::cuda

// SwiGLU kernels that quantize their output as they produce it (moe/ops/fp8_swiglu.h): the Rows and
// columns quantizers of fp8_tiles.cuh with a Source that computes the SwiGLU values instead of
// reading them. The values are rounded to the activation type before they are quantized and use
// swiglu_math.cuh's arithmetic, so the codes and scales are bit for bit those of the plain SwiGLU
// kernel (activation.cu) followed by the plain quantizer, without the round trip of the BF16
// tensor through memory:
//   forward:  reads gate_up, writes the output (kept for the backward) and its Rows tiles, where the
//             plain path writes the output and reads it back;
//   backward: reads gate_up and dout, writes dgate_up's Rows and columns tiles (the data gradient's
//             and the weight gradient's operands), where the plain path writes dgate_up in BF16 and
//             reads it back. A block of the columns kernel takes 128 features of dgate_up, so the
//             gate-half and the up-half blocks of the same rows both read those rows' gate, up and
//             dout; they run close together (8 blocks apart at H = 1024), so the second read is
//             mostly an L2 hit.
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

// Columns source: dgate_up [R, 2H] from dout [R, H] and gate_up [R, 2H]; feature c < H is the gate's
// gradient of unit c, feature c >= H the up projection's of unit c - H. vector (H % 16 == 0, aligned
// bases): a warp's 16 features lie in one half and every run is two aligned 16-byte loads.
template <typename T>
struct SwigluBackwardColumns {
  const T* gate_up = nullptr;
  const T* dout = nullptr;
  int64_t H = 0;
  __device__ __forceinline__ void load(Run16<T>& run, int64_t row, int64_t kw, int features, bool vector) const {
    const T* gu = gate_up + row * 2 * H;
    if (vector && features == kRun) {
      const bool up_half = kw >= H;
      const int64_t j = up_half ? kw - H : kw;
      Run16<T> g, u, d;
      g.load(gu + j, kRun, true);
      u.load(gu + H + j, kRun, true);
      d.load(dout + row * H + j, kRun, true);
#pragma unroll
      for (int f = 0; f < kRun; ++f) {
        const float gf = g.get(f), uf = u.get(f), df = d.get(f), s = swiglu_sigmoid(gf);
        run.set(f, up_half ? swiglu_grad_up(df, gf, s) : swiglu_grad_gate(df, gf, s, uf));
      }
      return;
    }
    for (int f = 0; f < features; ++f) {
      const int64_t c = kw + f;
      const bool up_half = c >= H;
      const int64_t j = up_half ? c - H : c;
      const float gf = to_f32(gu[j]), uf = to_f32(gu[H + j]), df = to_f32(dout[row * H + j]);
      const float s = swiglu_sigmoid(gf);
      run.set(f, up_half ? swiglu_grad_up(df, gf, s) : swiglu_grad_gate(df, gf, s, uf));
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
void launch_backward(const Fp8Tensor& rows, const Fp8Tensor& columns, const Tensor& dout, const Tensor& gate_up,
                     const Tensor& offsets, cudaStream_t s) {
  const int64_t R = rows_of(dout), H = dout.dim(-1), Mp = columns.codes.dim(-1);
  const bool vector = H % kRun == 0 && aligned(gate_up.data, 16) && aligned(dout.data, 16);
  const SwigluBackwardColumns<T> src{gate_up.ptr<const T>(), dout.ptr<const T>(), H};
  launch_columns<T>(columns, src, offsets, R, 2 * H, Mp, vector, &rows, "fp8_swiglu_backward", s);
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

void fp8_swiglu_backward(Fp8Tensor rows, Fp8Tensor columns, Tensor dout, Tensor gate_up, Tensor offsets,
                         Stream stream) {
  if (dout.dim(-1) == 0 || columns.codes.dim(-1) == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (dout.dtype == DType::BF16)
    launch_backward<__nv_bfloat16>(rows, columns, dout, gate_up, offsets, s);
  else
    launch_backward<float>(rows, columns, dout, gate_up, offsets, s);
}

}  // namespace moe::cuda

// CPU SwiGLU on the fused [gate | up] projection output (F32; ops/activation.cpp checks the call).
#include "moe/ops/cpu/activation.h"

#include <cmath>

namespace moe::cpu {
namespace {

inline float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

}  // namespace

void swiglu_forward(Tensor out, Tensor gate_up, Stream /*stream*/) {
  const int64_t R = out.dim(0), H = out.dim(1);
  const float* gu = gate_up.f32();
  float* y = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* g = gu + r * 2 * H;
    const float* u = g + H;
    float* yr = y + r * H;
    for (int64_t j = 0; j < H; ++j) yr[j] = g[j] * sigmoid(g[j]) * u[j];
  }
}

namespace {

// d silu(g) / dg = s + g s (1 - s) = s (1 + g (1 - s)), s = sigmoid(g). With `out` (non-empty),
// also the forward output, computed as swiglu_forward computes it: (g s) u.
void swiglu_backward_rows(Tensor dgate_up, Tensor out, Tensor dout, Tensor gate_up) {
  const int64_t R = dout.dim(0), H = dout.dim(1);
  const float* gu = gate_up.f32();
  const float* dy = dout.f32();
  float* dgu = dgate_up.f32();
  float* y = out.empty() ? nullptr : out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* g = gu + r * 2 * H;
    const float* u = g + H;
    const float* dyr = dy + r * H;
    float* dg = dgu + r * 2 * H;
    float* du = dg + H;
    for (int64_t j = 0; j < H; ++j) {
      const float s = sigmoid(g[j]);
      if (y) y[r * H + j] = g[j] * s * u[j];
      du[j] = dyr[j] * g[j] * s;
      dg[j] = dyr[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
    }
  }
}

}  // namespace

void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, Stream /*stream*/) {
  swiglu_backward_rows(dgate_up, Tensor(), dout, gate_up);
}

void swiglu_backward_with_output(Tensor dgate_up, Tensor out, Tensor dout, Tensor gate_up, Stream /*stream*/) {
  swiglu_backward_rows(dgate_up, out, dout, gate_up);
}

}  // namespace moe::cpu

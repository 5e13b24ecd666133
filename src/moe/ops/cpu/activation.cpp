// CPU SwiGLU on the fused [gate | up] projection output.
#include "moe/ops/cpu/activation.h"

#include <cmath>

namespace moe::cpu {
namespace {

void check_f32(const char* op, const char* name, const Tensor& t) {
  MOE_CHECK(t.device == Device::CPU, op, ": tensor ", name, " is not on the CPU");
  MOE_CHECK(t.dtype == DType::F32, op, ": tensor ", name, " must be F32, got ", dtype_name(t.dtype));
  MOE_CHECK(t.ndim() == 2, op, ": tensor ", name, " must be 2-D, got ", t.shape.str());
}

inline float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

}  // namespace

void swiglu_forward(Tensor out, Tensor gate_up, Stream /*stream*/) {
  const char* op = "swiglu_forward";
  check_f32(op, "out", out);
  check_f32(op, "gate_up", gate_up);
  const int64_t R = out.dim(0), H = out.dim(1);
  MOE_CHECK(gate_up.dim(0) == R && gate_up.dim(1) == 2 * H, op, ": gate_up ", gate_up.shape.str(),
            " must be [R, 2H] for out ", out.shape.str());
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

// d silu(g) / dg = s + g s (1 - s) = s (1 + g (1 - s)), s = sigmoid(g).
void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, Stream /*stream*/) {
  const char* op = "swiglu_backward";
  check_f32(op, "dgate_up", dgate_up);
  check_f32(op, "dout", dout);
  check_f32(op, "gate_up", gate_up);
  const int64_t R = dout.dim(0), H = dout.dim(1);
  MOE_CHECK(gate_up.dim(0) == R && gate_up.dim(1) == 2 * H, op, ": gate_up ", gate_up.shape.str(),
            " must be [R, 2H] for dout ", dout.shape.str());
  MOE_CHECK(dgate_up.shape == gate_up.shape, op, ": dgate_up ", dgate_up.shape.str(), " must match gate_up ",
            gate_up.shape.str());
  const float* gu = gate_up.f32();
  const float* dy = dout.f32();
  float* dgu = dgate_up.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* g = gu + r * 2 * H;
    const float* u = g + H;
    const float* dyr = dy + r * H;
    float* dg = dgu + r * 2 * H;
    float* du = dg + H;
    for (int64_t j = 0; j < H; ++j) {
      const float s = sigmoid(g[j]);
      du[j] = dyr[j] * g[j] * s;
      dg[j] = dyr[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
    }
  }
}

}  // namespace moe::cpu

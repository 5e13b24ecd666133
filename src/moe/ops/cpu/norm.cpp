// CPU RMSNorm over the last dimension. Row statistics are summed in double; values stay FP32.
#include "moe/ops/cpu/norm.h"

#include <cmath>

namespace moe::cpu {
namespace {

// Columns per task in the dweight reduction: each task owns its columns, so there are no races
// and the sum over rows runs in a fixed order (deterministic).
constexpr int64_t kColumnBlock = 64;

}  // namespace

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, Stream /*stream*/) {
  const int64_t C = weight.dim(0);
  const int64_t R = rstd.numel();
  const float* xp = x.f32();
  const float* wp = weight.f32();
  float* op_ = out.f32();
  float* rp = rstd.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = xp + r * C;
    double sum_sq = 0.0;
    for (int64_t c = 0; c < C; ++c) sum_sq += static_cast<double>(xr[c]) * xr[c];
    const float rs = static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(C) + eps));
    rp[r] = rs;
    float* yr = op_ + r * C;
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * rs * wp[c];
  }
}

// y_c = x_c * rstd * w_c with rstd = (mean x^2 + eps)^(-1/2), so d rstd / d x_j = -rstd^3 x_j / C and
//   dx_j = rstd * w_j * g_j - x_j * rstd^3 * (1/C) * sum_c w_c g_c x_c.
void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd,
                      bool accumulate_dx, Stream /*stream*/) {
  const int64_t C = weight.dim(0);
  const int64_t R = rstd.numel();
  const float* xp = x.f32();
  const float* wp = weight.f32();
  const float* gp = dout.f32();
  const float* rp = rstd.f32();
  float* dxp = dx.f32();
  float* dwp = dweight.f32();

#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = xp + r * C;
    const float* gr = gp + r * C;
    double dot = 0.0;  // sum_c w_c g_c x_c
    for (int64_t c = 0; c < C; ++c) dot += static_cast<double>(wp[c]) * gr[c] * xr[c];
    const float rs = rp[r];
    const float coef = static_cast<float>(static_cast<double>(rs) * rs * rs * dot / static_cast<double>(C));
    float* dxr = dxp + r * C;
    if (accumulate_dx) {
      for (int64_t c = 0; c < C; ++c) dxr[c] += rs * wp[c] * gr[c] - xr[c] * coef;
    } else {
      for (int64_t c = 0; c < C; ++c) dxr[c] = rs * wp[c] * gr[c] - xr[c] * coef;
    }
  }

  const int64_t n_blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < n_blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock;
    const int64_t c1 = c0 + kColumnBlock < C ? c0 + kColumnBlock : C;
    double acc[kColumnBlock] = {};
    for (int64_t r = 0; r < R; ++r) {
      const float* xr = xp + r * C;
      const float* gr = gp + r * C;
      const double rs = rp[r];
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += static_cast<double>(gr[c]) * xr[c] * rs;
    }
    for (int64_t c = c0; c < c1; ++c) dwp[c] += static_cast<float>(acc[c - c0]);
  }
}

}  // namespace moe::cpu

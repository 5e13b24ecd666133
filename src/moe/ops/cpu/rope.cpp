// CPU rotary position embedding, rotate-half convention (see moe/ops/rope.h).
//
// NOTES: angles, cos and sin are computed in double and rounded to FP32 once, so the rotation
// is exact to FP32 at every position. Hugging Face computes inv_freq and p * inv_freq in FP32,
// which differs from this by up to about p * 2^-24 radians (around 1e-4 at p = 2048); the
// PyTorch reference should compute its cos/sin tables in float64 to match closely.
#include "moe/ops/cpu/rope.h"

#include <cmath>

namespace moe::cpu {
namespace {

// Rotates every (x_i, x_{i+hd/2}) pair of every head by +angle (forward) or -angle (backward).
void rope_rotate(Tensor x, int64_t seq_len, int64_t n_heads, float theta, bool inverse) {
  const int64_t hd = x.dim(1) / n_heads;
  const int64_t rows = x.dim(0), width = x.dim(1), half = hd / 2;
  const double sign = inverse ? -1.0 : 1.0;
  float* xp = x.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const double pos = static_cast<double>(r % seq_len);
    float* xr = xp + r * width;
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / hd);
      const double angle = pos * inv_freq;
      const float cs = static_cast<float>(std::cos(angle));
      const float sn = static_cast<float>(sign * std::sin(angle));
      for (int64_t h = 0; h < n_heads; ++h) {
        float* head = xr + h * hd;
        const float a = head[i], b = head[i + half];
        // [a, b] -> [a cos - b sin, b cos + a sin]: out = x * cos + rotate_half(x) * sin.
        head[i] = a * cs - b * sn;
        head[i + half] = b * cs + a * sn;
      }
    }
  }
}

}  // namespace

void rope_forward(Tensor x, int64_t seq_len, int64_t n_heads, float theta, Stream /*stream*/) {
  rope_rotate(x, seq_len, n_heads, theta, /*inverse=*/false);
}

void rope_backward(Tensor dx, int64_t seq_len, int64_t n_heads, float theta, Stream /*stream*/) {
  rope_rotate(dx, seq_len, n_heads, theta, /*inverse=*/true);
}

}  // namespace moe::cpu

// CPU optimizer ops. The squared-norm reduction uses a fixed block partition (independent of
// the thread count) and sums the block partials in order, so it is deterministic.
#include "moe/ops/cpu/optim.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "moe/core/dtype.h"

namespace moe::cpu {

namespace {

constexpr int64_t kReduceBlock = 1 << 15;  // elements per partial sum

// Below this many elements of work a loop runs on the calling thread: waking the OpenMP team
// costs more than the loop.
constexpr int64_t kMinParallelWork = 1 << 15;

}  // namespace

int64_t sum_squares_workspace_elems(int64_t /*n*/) { return 0; }

void sum_squares_accumulate(Tensor out, Tensor x, Tensor /*workspace*/, Stream /*stream*/) {
  const int64_t n = x.numel();
  const float* xv = x.f32();
  const int64_t blocks = (n + kReduceBlock - 1) / kReduceBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = (b + 1) * kReduceBlock < n ? (b + 1) * kReduceBlock : n;
    double sum = 0.0;
    for (int64_t i = b * kReduceBlock; i < end; ++i) sum += static_cast<double>(xv[i]) * xv[i];
    partial[b] = sum;
  }
  double total = out.f32()[0];
  for (int64_t b = 0; b < blocks; ++b) total += partial[b];
  out.f32()[0] = static_cast<float>(total);
}

namespace {

// Moments stored as FP32, or as BF16: read widened (exact), stored rounded to nearest even.
inline float load_moment(const float* m, int64_t i) { return m[i]; }
inline float load_moment(const uint16_t* m, int64_t i) { return bf16_to_f32(m[i]); }
inline void store_moment(float* m, int64_t i, float x) { m[i] = x; }
inline void store_moment(uint16_t* m, int64_t i, float x) { m[i] = f32_to_bf16(x); }

struct AdamWScalars {
  float b1, b2, eps, step_size, bias2_sqrt, decay, clip;
};

template <typename Moment>
void adamw_update(float* p, const float* gv, Moment* mv, Moment* vv, uint16_t* copy, int64_t n,
                  const AdamWScalars& s) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float g = s.clip * gv[i];
    const float mi = s.b1 * load_moment(mv, i) + (1.0f - s.b1) * g;
    const float vi = s.b2 * load_moment(vv, i) + (1.0f - s.b2) * g * g;
    store_moment(mv, i, mi);
    store_moment(vv, i, vi);
    // The update uses the FP32 moments just computed; only what is stored is rounded. Same
    // operation order as torch: (m / (sqrt(v) / sqrt(bias2) + eps)) times the step size.
    p[i] = p[i] * s.decay - s.step_size * (mi / (std::sqrt(vi) / s.bias2_sqrt + s.eps));
    if (copy != nullptr) copy[i] = f32_to_bf16(p[i]);
  }
}

}  // namespace

void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                const AdamWConfig& cfg, int64_t step, Stream /*stream*/, Tensor schedule, Tensor param_bf16) {
  // lr and step from the schedule in memory when given (the update runs now, on this thread).
  float lr = cfg.lr;
  double step_count = static_cast<double>(step);
  if (!schedule.empty()) {
    lr = schedule.f32()[0];
    step_count = schedule.f32()[1];
  }

  const float norm_sq = grad_norm_sq.f32()[0];
  if (!std::isfinite(norm_sq)) return;  // skip the step: a non-finite gradient changes nothing
  const float clip =
      max_norm > 0.0f ? std::fmin(1.0f, static_cast<float>(max_norm / (std::sqrt(static_cast<double>(norm_sq)) + 1e-6)))
                      : 1.0f;
  // Scalars in double (as torch computes them in Python), applied in FP32.
  const double bias1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), step_count);
  const double bias2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), step_count);
  const AdamWScalars s{cfg.beta1,
                       cfg.beta2,
                       cfg.eps,
                       static_cast<float>(lr / bias1),
                       static_cast<float>(std::sqrt(bias2)),
                       static_cast<float>(1.0 - static_cast<double>(lr) * cfg.weight_decay),
                       clip};
  const int64_t n = param.numel();
  uint16_t* copy = param_bf16.empty() ? nullptr : param_bf16.ptr<uint16_t>();
  if (m.dtype == DType::BF16)
    adamw_update(param.f32(), grad.f32(), m.ptr<uint16_t>(), v.ptr<uint16_t>(), copy, n, s);
  else
    adamw_update(param.f32(), grad.f32(), m.f32(), v.f32(), copy, n, s);
}

}  // namespace moe::cpu

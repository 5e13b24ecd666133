// Learning-rate schedule: linear warmup from 0 over warmup_steps, then cosine decay to
// lr * min_lr_ratio at the last step.
#pragma once

#include <cmath>
#include <cstdint>

namespace moe {

// LR for optimizer step `step` (0-based) of `total_steps`.
inline double lr_at(int64_t step, int64_t total_steps, double peak, int64_t warmup_steps, double min_lr_ratio) {
  if (step < warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const int64_t decay_steps = total_steps - warmup_steps;
  if (decay_steps <= 1) return peak;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps - 1);
  const double cosine = 0.5 * (1.0 + std::cos(3.14159265358979323846 * std::fmin(progress, 1.0)));
  return peak * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine);
}

}  // namespace moe

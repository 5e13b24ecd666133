// Learning-rate schedules: a linear warmup from 0 over warmup_steps, then one of
//   cosine:   cosine decay to lr * min_lr_ratio at the last step (OLMoE's);
//   linear:   linear decay to lr * min_lr_ratio at the last step;
//   constant: lr to the end;
//   wsd:      warmup-stable-decay: lr until the last decay_steps steps, which fall linearly (each
//             below lr) to lr * min_lr_ratio at the last step. The stable phase does not depend on the run's
//             length, so a run extended on resume (a larger train.steps) keeps its learning rate
//             until its new decay, where cosine and linear would jump to another curve.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace moe {

enum class LrSchedule { Cosine, Linear, Constant, Wsd };

// The decay steps of a wsd schedule: `decay_steps`, or with 0 a fifth of the steps after warmup;
// at least 1, and at most the steps after warmup (a short run of a long run's config, such as
// `bench` or `--steps 100`, decays over all of them).
inline int64_t wsd_decay_steps(int64_t total_steps, int64_t warmup_steps, int64_t decay_steps) {
  const int64_t after_warmup = std::max<int64_t>(1, total_steps - warmup_steps);
  return std::min(after_warmup, decay_steps > 0 ? decay_steps : std::max<int64_t>(1, after_warmup / 5));
}

// LR for optimizer step `step` (0-based) of `total_steps`.
inline double lr_at(int64_t step, int64_t total_steps, double peak, int64_t warmup_steps, double min_lr_ratio,
                    LrSchedule schedule = LrSchedule::Cosine, int64_t decay_steps = 0) {
  if (step < warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (schedule == LrSchedule::Constant) return peak;
  double progress = 0;  // of the decay: 0 at the peak, 1 at the floor (the last step)
  if (schedule == LrSchedule::Wsd) {
    // The last `decay` steps, each a further 1/decay of the way down.
    const int64_t decay = wsd_decay_steps(total_steps, warmup_steps, decay_steps);
    const int64_t done = step - (total_steps - decay) + 1;
    if (done <= 0) return peak;
    progress = std::fmin(static_cast<double>(done) / static_cast<double>(decay), 1.0);
  } else {
    // Every step after the warmup, the first at the peak.
    const int64_t span = total_steps - warmup_steps;
    if (span <= 1) return peak;
    progress = std::fmin(static_cast<double>(step - warmup_steps) / static_cast<double>(span - 1), 1.0);
  }
  const double remaining = schedule == LrSchedule::Cosine ? 0.5 * (1.0 + std::cos(3.14159265358979323846 * progress))
                                                          : 1.0 - progress;
  return peak * (min_lr_ratio + (1.0 - min_lr_ratio) * remaining);
}

}  // namespace moe

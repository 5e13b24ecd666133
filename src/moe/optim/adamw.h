// AdamW over the registry's flat buffers with global-norm clipping and the non-finite skip
// decided from the squared norm in memory (no host decision needed on the GPU path).
// Single-rank form: moments cover every parameter this rank holds. The sharded (ZeRO-1)
// form over replica groups arrives with multi-rank training and keeps this interface.
#pragma once

#include <cstdint>

#include "moe/core/arena.h"
#include "moe/model/params.h"
#include "moe/ops/optim.h"

namespace moe {

class AdamW {
 public:
  // Reserves the moments (exp_avg, exp_avg_sq, in moment_dtype: F32 or BF16), the norm scalar and
  // its workspace in `arena`.
  AdamW(const ParamRegistry& reg, Arena& arena, DType moment_dtype = DType::F32);

  using Result = AdamWOutcome;  // the norm before clipping; skipped: non-finite, nothing updated
  // One step (step counts from 1). Weight decay applies to entries with decay = true.
  Result step(const Tensor& params, const Tensor& grads, const AdamWConfig& cfg, float max_norm, int64_t step);

  Tensor exp_avg() const { return arena_.get(m_); }
  Tensor exp_avg_sq() const { return arena_.get(v_); }

 private:
  const ParamRegistry& reg_;
  Arena& arena_;
  Arena::Slot m_, v_, norm_sq_, norm_ws_;  // norm_ws_: sum_squares_accumulate's workspace
};

}  // namespace moe

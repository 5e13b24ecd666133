#include "moe/optim/adamw.h"

#include <cmath>

#include "moe/ops/elementwise.h"

namespace moe {

AdamW::AdamW(const ParamRegistry& reg, Arena& arena, DType moment_dtype) : reg_(reg), arena_(arena) {
  MOE_CHECK(moment_dtype == DType::F32 || moment_dtype == DType::BF16, "AdamW: moments are F32 or BF16, not ",
            dtype_name(moment_dtype));
  const int64_t n = reg.total_numel();
  m_ = arena.reserve("optimizer.exp_avg", moment_dtype, {n});
  v_ = arena.reserve("optimizer.exp_avg_sq", moment_dtype, {n});
  norm_sq_ = arena.reserve("optimizer.grad_norm_sq", DType::F32, {1});
  norm_ws_ =
      arena.reserve("optimizer.grad_norm_workspace", DType::F32, {sum_squares_workspace_elems(arena.device(), n)});
}

AdamW::Result AdamW::step(const Tensor& params, const Tensor& grads, const AdamWConfig& cfg, float max_norm,
                          int64_t step) {
  Tensor norm_sq = arena_.get(norm_sq_), m = arena_.get(m_), v = arena_.get(v_);
  fill_zero(norm_sq);
  sum_squares_accumulate(norm_sq, grads, arena_.get(norm_ws_));
  AdamWConfig no_decay = cfg;
  no_decay.weight_decay = 0.0f;
  for (int i = 0; i < static_cast<int>(reg_.entries().size()); ++i) {
    adamw_step(reg_.view(params, i), reg_.view(grads, i), reg_.view(m, i), reg_.view(v, i), norm_sq, max_norm,
               reg_.entry(i).decay ? cfg : no_decay, step);
  }
  return read_adamw_outcome(norm_sq);
}

}  // namespace moe

#include "moe/ops/optim.h"

#include "moe/ops/cpu/optim.h"
#include "moe/ops/dispatch.h"

namespace moe {

void sum_squares_accumulate(Tensor out, Tensor x, Stream stream) {
  MOE_OP_DISPATCH(x.device, sum_squares_accumulate, out, x, stream);
}

void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                const AdamWConfig& cfg, int64_t step, Stream stream) {
  MOE_OP_DISPATCH(param.device, adamw_step, param, grad, m, v, grad_norm_sq, max_norm, cfg, step, stream);
}

}  // namespace moe

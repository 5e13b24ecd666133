#include "moe/ops/loss.h"

#include "moe/ops/cpu/loss.h"
#include "moe/ops/dispatch.h"

namespace moe {

void lm_head_cross_entropy(Tensor loss_sum, Tensor dh, Tensor dweight, Tensor h, Tensor weight, Tensor targets,
                           float grad_scale, Tensor workspace, Stream stream) {
  MOE_OP_DISPATCH(h.device, lm_head_cross_entropy, loss_sum, dh, dweight, h, weight, targets, grad_scale,
                  workspace, stream);
}

}  // namespace moe

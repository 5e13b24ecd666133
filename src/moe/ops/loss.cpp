#include "moe/ops/loss.h"

#include "moe/ops/cpu/loss.h"
#include "moe/ops/dispatch.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/loss.h")
#include "moe/ops/cuda/loss.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void lm_head_cross_entropy(Tensor loss_sum, Tensor dh, Tensor dweight, Tensor h, Tensor weight, Tensor targets,
                           float grad_scale, Tensor workspace, Stream stream) {
  MOE_OP_DISPATCH(h.device, lm_head_cross_entropy, loss_sum, dh, dweight, h, weight, targets, grad_scale,
                  workspace, stream);
}

}  // namespace moe

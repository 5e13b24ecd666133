#include "moe/ops/router.h"

#include "moe/ops/cpu/router.h"
#include "moe/ops/dispatch.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/router.h")
#include "moe/ops/cuda/router.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void router_forward(Tensor scores, Tensor topk_idx, Tensor topk_weight, Tensor logits, Tensor bias, ScoreFn fn,
                    bool normalize, Stream stream) {
  MOE_OP_DISPATCH(logits.device, router_forward, scores, topk_idx, topk_weight, logits, bias, fn, normalize, stream);
}

void synthetic_routing(Tensor topk_idx, Tensor topk_weight, bool random, int64_t num_experts, uint64_t seed,
                       int64_t layer, Stream stream) {
  MOE_OP_DISPATCH(topk_idx.device, synthetic_routing, topk_idx, topk_weight, random, num_experts, seed, layer, stream);
}

void router_losses(Tensor lb_loss, Tensor z_loss, Tensor expert_counts, Tensor scores, Tensor logits, int top_k,
                   Stream stream) {
  MOE_OP_DISPATCH(logits.device, router_losses, lb_loss, z_loss, expert_counts, scores, logits, top_k, stream);
}

void router_backward(Tensor dlogits, Tensor dtopk_weight, Tensor topk_idx, Tensor topk_weight, Tensor scores,
                     Tensor logits, Tensor expert_counts, float lb_scale, float z_scale, ScoreFn fn, bool normalize,
                     Stream stream) {
  MOE_OP_DISPATCH(dlogits.device, router_backward, dlogits, dtopk_weight, topk_idx, topk_weight, scores, logits,
                  expert_counts, lb_scale, z_scale, fn, normalize, stream);
}

}  // namespace moe

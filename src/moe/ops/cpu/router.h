// CPU router: the reference meaning of ops/router.h (same signatures, FP32 compute; ops/router.cpp
// checks the arguments).
#pragma once

#include "moe/ops/router.h"

namespace moe::cpu {

void router_forward(Tensor scores, Tensor topk_idx, Tensor topk_weight, Tensor logits, Tensor bias, ScoreFn fn,
                    bool normalize, Stream stream = {});
void synthetic_routing(Tensor topk_idx, Tensor topk_weight, bool random, int64_t num_experts, uint64_t seed,
                       int64_t layer, Stream stream = {});
// No workspace: the partial sums live in host vectors.
int64_t router_losses_workspace_elems(int64_t tokens, int64_t experts);
void router_losses(Tensor lb_loss, Tensor z_loss, Tensor expert_counts, Tensor scores, Tensor logits, int top_k,
                   Tensor workspace, Stream stream = {});
void router_backward(Tensor dlogits, Tensor dtopk_weight, Tensor topk_idx, Tensor topk_weight, Tensor scores,
                     Tensor logits, Tensor expert_counts, float lb_scale, float z_scale, ScoreFn fn, bool normalize,
                     Stream stream = {});

}  // namespace moe::cpu

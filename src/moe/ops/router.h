// Router: scores, top-K selection, combine weights, and the auxiliary losses.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

enum class ScoreFn { Softmax, Sigmoid };

// logits [T, N] FP32 (= x Wg^T, computed by matmul). Writes
//   scores [T, N]: softmax or sigmoid of the logits (FP32);
//   topk_idx [T, K] i32: the K experts with the largest scores[t,e] + bias[e] (bias [N] is a
//     selection-only bias for auxiliary-loss-free balancing; empty tensor = no bias), in
//     descending order of that sum, ties broken by the lower expert index;
//   topk_weight [T, K]: scores at the selected experts (without the bias), divided by their
//     sum over k when normalize is true.
void router_forward(Tensor scores, Tensor topk_idx, Tensor topk_weight, Tensor logits, Tensor bias, ScoreFn fn,
                    bool normalize, Stream stream = {});

// Benchmark routings (model.routing = uniform | random) replace the router's choice; the router
// still runs (same cost). topk_idx [T, K] i32, topk_weight [T, K] F32 (set to 1/K).
//   uniform: idx[t,k] = (t*K + k) % num_experts;
//   random:  K distinct experts per token t, drawn from Rng(hash_counters(seed, layer, t)) by
//            below(num_experts), redrawing repeats: a pure function of (seed, layer, t).
// K <= num_experts (K distinct experts must exist). Computed where the tensors live, so the GPU
// step needs no host loop and no upload.
void synthetic_routing(Tensor topk_idx, Tensor topk_weight, bool random, int64_t num_experts, uint64_t seed,
                       int64_t layer, Stream stream = {});

// F32 elements of the workspace router_losses needs on `device` for `tokens` x `experts` logits
// (the GPU's per-block partial sums; 0 on the CPU). Reserved by the caller when it plans memory.
int64_t router_losses_workspace_elems(Device device, int64_t tokens, int64_t experts);

// expert_counts [N] i32 = number of (t, k) routes selecting each expert (before any drop).
// lb_loss [1] = (N/K) * sum_e (count_e / T) * P_e with P_e = mean_t scores[t,e]  (1.0 when balanced);
// z_loss [1] = mean_t logsumexp_e(logits[t,e])^2.
// workspace: F32 with at least router_losses_workspace_elems(logits.device, T, N) elements on the
// logits' device (may be empty when that is 0), owned by this call until it completes: calls on
// different streams run concurrently when each has its own workspace.
void router_losses(Tensor lb_loss, Tensor z_loss, Tensor expert_counts, Tensor scores, Tensor logits, int top_k,
                   Tensor workspace, Stream stream = {});

// dlogits [T, N] (overwritten) = gradient of
//   sum_{t,k} dtopk_weight[t,k] * topk_weight[t,k] + lb_scale * lb_loss + z_scale * z_loss
// with respect to the logits; counts are constants (the selection is not differentiable).
void router_backward(Tensor dlogits, Tensor dtopk_weight, Tensor topk_idx, Tensor topk_weight, Tensor scores,
                     Tensor logits, Tensor expert_counts, float lb_scale, float z_scale, ScoreFn fn, bool normalize,
                     Stream stream = {});

}  // namespace moe

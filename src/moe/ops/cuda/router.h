// CUDA router: the GPU implementation of moe/ops/router.h (same signatures, same meaning as moe::cpu).
//
// Dtype contract (as on the CPU, checked by ops/router.cpp): logits, scores, bias, topk_weight,
// dtopk_weight, dlogits F32; topk_idx, expert_counts I32; lb_loss, z_loss F32 [1]. Every tensor
// lives on the CUDA device.
// Each op only enqueues kernels on `stream`: no allocation, no host copy, no synchronization, and
// no device data is read on the host (so checks that need the data, such as the CPU's range
// check of topk_idx in router_backward, are not made: an expert id outside [0, N) is skipped).
// Limit: N <= 256 experts (one warp holds a token's scores in registers, 8 per lane).
// Deterministic: the same inputs give bit-identical outputs (no float atomics; every reduction
// runs in a fixed order).
#pragma once

#include "moe/ops/router.h"

namespace moe::cuda {

void router_forward(Tensor scores, Tensor topk_idx, Tensor topk_weight, Tensor logits, Tensor bias, ScoreFn fn,
                    bool normalize, Stream stream = {});

// One thread per token; the random draws use the host's mix64/hash_counters (moe/core/rng.h), so
// the result equals the CPU's bit for bit. Any num_experts that fits I32 (no 256 limit here).
void synthetic_routing(Tensor topk_idx, Tensor topk_weight, bool random, int64_t num_experts, uint64_t seed,
                       int64_t layer, Stream stream = {});

// NOTES: reduces over tokens through per-block partial sums in the caller's workspace (FP64:
// blocks x (N + 1) doubles, blocks = min(T, 128), 8-byte aligned), added in block order by a second
// kernel. Each call owns its workspace, so calls on different streams may overlap when their
// workspaces differ.
int64_t router_losses_workspace_elems(int64_t tokens, int64_t experts);
void router_losses(Tensor lb_loss, Tensor z_loss, Tensor expert_counts, Tensor scores, Tensor logits, int top_k,
                   Tensor workspace, Stream stream = {});

void router_backward(Tensor dlogits, Tensor dtopk_weight, Tensor topk_idx, Tensor topk_weight, Tensor scores,
                     Tensor logits, Tensor expert_counts, float lb_scale, float z_scale, ScoreFn fn, bool normalize,
                     Stream stream = {});

}  // namespace moe::cuda

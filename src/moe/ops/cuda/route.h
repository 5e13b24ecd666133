// CUDA routing metadata: the GPU implementation of moe/ops/route.h (same signatures, same meaning
// as moe::cpu).
//
// Dtype contract (as on the CPU, checked by ops/route.cpp): topk_idx [T, K], expert_counts [N],
// route_index [T*K] and expert_offsets [N+1] are I32 on the CUDA device. Counts, the exclusive prefix over experts, the
// tail-drop clamp at rank_capacity and each route's row are all computed in kernels: no
// allocation, no host copy, no synchronization.
// Checks that need device data are not made on the host:
//   - route_counts ignores expert ids outside [0, N) (the CPU rejects them);
//   - route_index_local writes -1 for a route whose expert id lies outside [0, N), and trusts
//     expert_counts to be the route_counts of topk_idx (the CPU verifies that; wrong counts here
//     give overlapping or misplaced rows).
// Deterministic: integer work only, each output element written by exactly one thread.
#pragma once

#include "moe/ops/route.h"

namespace moe::cuda {

void route_counts(Tensor expert_counts, Tensor topk_idx, Stream stream = {});

void route_index_local(Tensor route_index, Tensor expert_offsets, Tensor topk_idx, Tensor expert_counts,
                       int64_t rank_capacity, Stream stream = {});

// One thread per expert; exact as on the CPU (each count converted to FP32 and added once).
void accumulate_counts(Tensor load, Tensor counts, Stream stream = {});

}  // namespace moe::cuda

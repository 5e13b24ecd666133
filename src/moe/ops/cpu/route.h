// CPU routing metadata: the reference meaning of ops/route.h (same signatures).
#pragma once

#include "moe/ops/route.h"

namespace moe::cpu {

void route_counts(Tensor expert_counts, Tensor topk_idx, Stream stream = {});
void route_index_local(Tensor route_index, Tensor expert_offsets, Tensor topk_idx, Tensor expert_counts,
                       int64_t rank_capacity, Stream stream = {});
void accumulate_counts(Tensor load, Tensor counts, Stream stream = {});

}  // namespace moe::cpu

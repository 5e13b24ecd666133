#include "moe/ops/route.h"

#include "moe/ops/cpu/route.h"
#include "moe/ops/dispatch.h"

namespace moe {

void route_counts(Tensor expert_counts, Tensor topk_idx, Stream stream) {
  MOE_OP_DISPATCH(topk_idx.device, route_counts, expert_counts, topk_idx, stream);
}

void route_index_local(Tensor route_index, Tensor expert_offsets, Tensor topk_idx, Tensor expert_counts,
                       int64_t rank_capacity, Stream stream) {
  MOE_OP_DISPATCH(topk_idx.device, route_index_local, route_index, expert_offsets, topk_idx, expert_counts,
                  rank_capacity, stream);
}

}  // namespace moe

// plan() of the multi-rank dispatchers (DESIGN.md section 6, steps 2-4): agree on the counts
// over the EP group, place every route, write this rank's route index and expert offsets.
#pragma once

#include <cstdint>

#include "moe/comm/communicator.h"
#include "moe/model/dispatch.h"
#include "moe/parallel/placement.h"

namespace moe {

// gathered_counts [P*N] i32 is the dispatcher's own buffer for the all-gathered counts.
// Collective over ep_group. Leaves `placement` holding the agreed placement of this microbatch.
void ep_plan(Communicator& ep_group, Placement& placement, Tensor gathered_counts, const RoutePlan& plan,
             Tensor topk_idx, Tensor expert_counts, int64_t num_experts, int64_t rows, const char* backend);

}  // namespace moe

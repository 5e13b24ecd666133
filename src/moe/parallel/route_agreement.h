// place_routes of the multi-rank CPU dispatchers (DESIGN.md section 6, steps 2-4): agree on the
// counts over the EP group, check them, place every route, write this rank's route index and
// expert offsets. (The GPU rowwise dispatcher does the same on the device.)
#pragma once

#include <cstdint>

#include "moe/comm/communicator.h"
#include "moe/model/dispatch.h"
#include "moe/parallel/placement.h"

namespace moe {

// gathered_counts [P*N] i32 is the dispatcher's own buffer for the all-gathered counts. Collective
// over ep_group. Leaves `placement` holding the agreed placement of this microbatch. Throws naming
// `backend` and `layer` when expert_counts is not the histogram of topk_idx, or when a rank's agreed
// counts are inconsistent (a negative count, or not T*K routes in all: every rank routes T*K).
void agree_and_place_routes(Communicator& ep_group, Placement& placement, Tensor gathered_counts, int layer,
                            const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts, int64_t num_experts,
                            int64_t rows, const char* backend);

}  // namespace moe

// place_routes of the multi-rank CPU dispatchers: agree on the
// counts over the EP group, check them, place every route, write this rank's route index and
// expert offsets. (The GPU rowwise dispatcher does the same on the device.)
#pragma once

#include <cstdint>

#include "moe/comm/communicator.h"
#include "moe/core/arena.h"
#include "moe/model/dispatch.h"
#include "moe/parallel/placement.h"

namespace moe {

// One dispatcher's count agreement: its buffer for the all-gathered counts and the placement of the
// last microbatch it placed.
class RouteAgreement {
 public:
  // Reserves the [P*N] i32 buffer for the gathered counts in `arena` (which the caller commits).
  // rows: each rank's expert buffer rows; backend: names the dispatcher in errors ("rowwise").
  void reserve(Communicator& ep_group, Arena& arena, int64_t num_experts, int64_t rows, const char* backend);

  // Collective over ep_group. Leaves placement() holding the agreed placement of this microbatch.
  // Throws naming the backend and `layer` when expert_counts is not the histogram of topk_idx, or
  // when a rank's agreed counts are inconsistent (a negative count, or not T*K routes in all:
  // every rank routes T*K).
  void place(int layer, const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts);

  const Placement& placement() const { return placement_; }

 private:
  Communicator* ep_group_ = nullptr;
  Arena* arena_ = nullptr;
  Arena::Slot gathered_counts_;
  int64_t num_experts_ = 0, rows_ = 0;
  const char* backend_ = "";
  Placement placement_;
};

}  // namespace moe

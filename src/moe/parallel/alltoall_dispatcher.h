// The alltoall dispatcher (`ep.backend = alltoall`): the baseline the rowwise backend is measured
// against, and the fallback where no symmetric memory exists. Same placement and identical results
// as rowwise, but rows travel by Communicator::all_to_all_v with host-side
// split counts: dispatch packs each destination's rows in the destination's row order into a
// route-side buffer, exchanges them into an expert-side staging buffer and scatters them to their
// rows of expert_in; combine does the reverse with expert_out. Backward mirrors both. All buffers
// come from the arena (nothing symmetric).
//
// The exchange layout (split counts, where each route sits in the packed route-side buffer, which
// expert row each received row belongs to) follows from the placement, which only place_routes()
// knows. place_routes() therefore records it per route plan, keyed by the route_index buffer, and dispatch,
// combine and their backward of that plan look it up (backward makes no new agreement).
#pragma once

#include <map>
#include <optional>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/parallel/expert_buffers.h"
#include "moe/parallel/route_agreement.h"

namespace moe {

class AllToAllDispatcher final : public PooledDispatcher {
 public:
  AllToAllDispatcher(Communicator& ep_group, int64_t num_experts, double capacity_factor, bool dropless);

  const char* name() const override { return "alltoall"; }
  void reserve_buffers(const DispatchShape& shape, Arena& arena) override;

  void place_routes(int layer, const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts, Stream stream) override;
  void dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) override;
  // Refused: the payload stays in the activation dtype (reserve_buffers refuses ep.payload = "fp8").
  void dispatch_fp8(Fp8Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) override;
  void combine(Tensor out, Tensor expert_out, Tensor weights, const RoutePlan& plan, int top_k,
               Stream stream) override;
  void combine_backward(Tensor d_expert_out, Tensor dweights, Tensor dout, Tensor expert_out, Tensor weights,
                        const RoutePlan& plan, int top_k, Stream stream) override;
  void dispatch_backward(Tensor dx, Tensor d_expert_in, const RoutePlan& plan, int top_k, Stream stream) override;

 private:
  // How one route plan's rows are exchanged.
  struct Layout {
    std::vector<int32_t> route_pos;     // [T*K]: row of route (t, k) in the packed route-side buffer, or -1
    std::vector<int64_t> route_counts;  // [P]: rows this rank sends to (and gets back from) rank d
    std::vector<int64_t> expert_counts; // [P]: rows this rank receives from (and returns to) rank s
    std::vector<int32_t> expert_rows;   // expert-buffer row of each received row, in receive order
    int64_t route_total = 0, expert_total = 0;
  };
  const Layout& layout_of(const RoutePlan& plan, const char* op) const;
  // Route side -> expert side: the packed route_buf rows travel to their experts' ranks, arriving
  // in the stage in receive order, and are stored into their rows of expert_rows ([rows, D]).
  void send_to_experts(const Layout& L, float* expert_rows);
  // Expert side -> route side: this rank's rows of expert_rows for each source, gathered into the
  // stage in receive order, travel back to the sources' packed route_buf rows; returns route_buf.
  float* send_to_routes(const Layout& L, const float* expert_rows);
  void count_bytes(const Layout& L);  // dispatch's and combine's payload of one placement

  Communicator& ep_group_;
  Arena* arena_ = nullptr;
  std::optional<ArenaMemory> memory_;
  Arena::Slot route_buf_slot_, stage_slot_;
  Tensor route_buf_, stage_;  // [T*K, D] route side, [rows, D] expert side
  RouteAgreement agreement_;
  std::map<const void*, Layout> layouts_;  // by route_index data
  std::vector<int64_t> send_elems_, recv_elems_;   // split counts of one exchange, in elements
  std::vector<int64_t> displ_scratch_, prefix_scratch_;  // place_routes() scratch, reused
};

}  // namespace moe

// The rowwise dispatcher (the default `ep.backend`): every expert buffer
// (the lease pools' expert_in/expert_out and the backward scratch) lives in one SymmetricHeap
// over the EP group, so a rank stores each routed row straight into the owner's buffer (PUT)
// and loads each expert result straight from it (GET). No packing, no all-to-all; the only
// collectives are the count all-gather in place_routes() and the heap syncs that order the phases.
//
// Payload fp8 (ep.payload): dispatch_fp8 quantizes each token row once and stores its codes and
// scales into the owners' expert_in codes and scales buffers, with the same syncs as dispatch.
//
// Sync schedule per MoE layer (every rank of the EP group makes the same calls in the same order):
//   forward:  place_routes (all-gather) | dispatch: PUT expert_in, SYNC | experts (local) | combine: SYNC, GET expert_out
//   backward: combine_backward: PUT d_expert_out, GET expert_out, SYNC | experts (local) |
//             dispatch_backward: SYNC, GET d_expert_in, SYNC
// With recompute (train.recompute = block) the backward opens with dispatch again (PUT into the
// shared recompute expert_in, SYNC) and the recomputed experts, and combine_backward of the
// recompute pair's expert_out opens with a SYNC.
// The hazard each sync removes is written next to it in rowwise_dispatcher.cpp (NOTES:).
#pragma once

#include <memory>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/comm/symmetric_heap.h"
#include "moe/parallel/expert_buffers.h"
#include "moe/parallel/route_agreement.h"

namespace moe {

class RowwiseDispatcher final : public PooledDispatcher {
 public:
  // ep_group: the ranks of this EP group (inside one node); rank r holds experts [r*E, (r+1)*E).
  RowwiseDispatcher(Communicator& ep_group, int64_t num_experts, double capacity_factor, bool dropless);

  const char* name() const override { return "rowwise"; }
  bool routes_stay_local() const override { return ep_group_.size() == 1; }
  // Collective over the EP group (allocates the heap; on a plans_only() group, only sizes it).
  void reserve_buffers(const DispatchShape& shape, Arena& arena) override;
  size_t heap_bytes() const override { return heap_ ? heap_->bytes_per_rank() : planned_heap_bytes_; }

  void place_routes(int layer, const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts, Stream stream) override;
  void dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) override;
  void dispatch_fp8(Fp8Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) override;
  void combine(Tensor out, Tensor expert_out, Tensor weights, const RoutePlan& plan, int top_k,
               Stream stream) override;
  void combine_backward(Tensor d_expert_out, Tensor dweights, Tensor dout, Tensor expert_out, Tensor weights,
                        const RoutePlan& plan, int top_k, Stream stream) override;
  void dispatch_backward(Tensor dx, Tensor d_expert_in, const RoutePlan& plan, int top_k, Stream stream) override;

 private:
  // Checks that `t` is a [rows, D] F32 buffer of the heap, then fills peers[r] with the address
  // of the same buffer on rank r.
  void resolve_peers(std::vector<float*>& peers, const Tensor& t, const char* op, const char* what);
  // Checks that `t` lies in the heap, then fills peers[r] with its address on rank r.
  template <typename Elem>
  void peer_addresses(std::vector<Elem*>& peers, const Tensor& t, const char* op, const char* what) const;
  // Payload of dispatch and combine: every kept route's row twice, and those of other ranks.
  void count_bytes(const RoutePlan& plan);

  Communicator& ep_group_;
  HeapLayout layout_{Device::CPU};  // every expert buffer, at the same offsets on every rank
  std::unique_ptr<SymmetricHeap> heap_;
  size_t planned_heap_bytes_ = 0;  // plans_only(): the heap a run would allocate
  RouteAgreement agreement_;
  std::vector<float*> peer_rows_, peer_rows_2_;  // per-call scratch: a buffer's address on each rank
  std::vector<uint8_t*> peer_codes_;             // the same for dispatch_fp8's codes
};

}  // namespace moe

// The rowwise dispatcher (DESIGN.md section 6, the default `ep.backend`): every expert buffer
// (the lease pools' expert_in/expert_out and the backward scratch) lives in one SymmetricHeap
// over the EP group, so a rank stores each routed row straight into the owner's buffer (PUT)
// and loads each expert result straight from it (GET). No packing, no all-to-all; the only
// collectives are the count all-gather in plan() and the heap syncs that order the phases.
//
// Sync schedule per MoE layer (every rank of the EP group makes the same calls in the same order):
//   forward:  plan (all-gather) | dispatch: PUT expert_in, SYNC | experts (local) | combine: SYNC, GET expert_out
//   backward: combine_backward: PUT d_expert_out, GET expert_out, SYNC | experts (local) |
//             dispatch_backward: SYNC, GET d_expert_in, SYNC
// The hazard each sync removes is written next to it in rowwise_dispatcher.cpp (NOTES:).
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/comm/symmetric_heap.h"
#include "moe/model/dispatch.h"
#include "moe/parallel/placement.h"

namespace moe {

class RowwiseDispatcher final : public TokenDispatcher {
 public:
  // ep_group: the ranks of this EP group (inside one node); rank r holds experts [r*E, (r+1)*E).
  RowwiseDispatcher(Communicator& ep_group, int64_t num_experts, double capacity_factor, bool dropless);

  const char* name() const override { return "rowwise"; }
  int64_t expert_rows(int64_t tokens, int64_t top_k) const override;
  int64_t first_expert() const override { return ep_group_.rank() * local_experts_; }
  int64_t local_experts() const override { return local_experts_; }

  void plan_buffers(const DispatchShape& shape, Arena& arena) override;
  Lease acquire(int layer) override;
  void release(const Lease& lease) override;
  ExpertBuffers grad_buffers() override;

  void plan(const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts, Stream stream) override;
  void dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) override;
  void combine(Tensor out, Tensor expert_out, Tensor weights, const RoutePlan& plan, int top_k,
               Stream stream) override;
  void combine_backward(Tensor d_expert_out, Tensor dweights, Tensor dout, Tensor expert_out, Tensor weights,
                        const RoutePlan& plan, int top_k, Stream stream) override;
  void dispatch_backward(Tensor dx, Tensor d_expert_in, const RoutePlan& plan, int top_k, Stream stream) override;

  // Payload bytes moved by dispatch and combine since construction (or the last reset): all rows,
  // and the part that crossed to another rank. Backward traffic is not counted.
  int64_t bytes_moved() const { return bytes_moved_; }
  int64_t remote_bytes_moved() const { return remote_bytes_moved_; }
  void reset_bytes_moved() { bytes_moved_ = remote_bytes_moved_ = 0; }

 private:
  Tensor heap_tensor(size_t offset) const;
  // Checks that `t` is a [rows, D] F32 buffer of the heap, then fills peers[r] with the address
  // of the same buffer on rank r.
  void resolve_peers(std::vector<float*>& peers, const Tensor& t, const char* op, const char* what);
  void check_tokens(const Tensor& t, int64_t cols, const char* op, const char* what) const;
  void count_bytes(const RoutePlan& plan);

  Communicator& ep_group_;
  int64_t num_experts_, local_experts_;
  double capacity_factor_;
  bool dropless_;
  int64_t tokens_ = 0, top_k_ = 0, hidden_ = 0, rows_ = 0;
  std::unique_ptr<SymmetricHeap> heap_;
  size_t buffer_bytes_ = 0;                                 // one [rows, D] F32 buffer, aligned
  std::vector<std::vector<std::pair<size_t, size_t>>> slots_;  // [layer][slot] -> heap offsets (in, out)
  std::pair<size_t, size_t> grad_slots_{};                  // heap offsets (d_expert_in, d_expert_out)
  LeasePools pools_;
  Arena* arena_ = nullptr;
  Arena::Slot gathered_counts_;
  Placement placement_;
  std::vector<float*> peer_rows_, peer_rows_2_;  // per-call scratch: a buffer's address on each rank
  int64_t bytes_moved_ = 0, remote_bytes_moved_ = 0;
};

}  // namespace moe

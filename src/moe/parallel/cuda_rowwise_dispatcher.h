// The rowwise dispatcher on GPUs (DESIGN.md section 6, issue 5): the same algorithm and sync schedule as
// RowwiseDispatcher (rowwise_dispatcher.h), over a SymmetricHeap of NCCL registered windows. Kernels store each routed
// row straight into the owner's expert_in through its LSA pointer (PUT) and load each expert result straight from the
// owner's expert_out (GET).
//
// Counts are agreed on the device: plan() stores this rank's expert_counts [N] into slot [me] of every rank's count
// area in the heap ([P][N] i32), syncs the heap, and one kernel computes the route index and the local expert offsets
// from the gathered counts (the placement of placement.h: tail drop local-expert-major, then source rank, then (t, k)
// order). Nothing is copied to the host and nothing waits on it, so every call can be captured in a CUDA graph. With
// one GPU it runs with EP = 1 through the same kernels (the peer table has one entry).
//
// Sync schedule per MoE layer (every rank makes the same calls in the same order):
//   forward:  plan: PUT counts, SYNC, route index | dispatch: PUT expert_in, SYNC | experts (local) |
//             combine: SYNC, GET expert_out
//   backward: combine_backward: PUT d_expert_out, GET expert_out, SYNC | experts (local) |
//             dispatch_backward: SYNC, GET d_expert_in, SYNC
// The hazard each sync removes is written next to it in cuda_rowwise_dispatcher.cu (NOTES:).
//
// Contract: tokens (x, out, dout, dx) and expert rows have the shape's dtype (BF16 on the GPU; F32 also works); weights
// and dweights are F32; topk_idx, expert_counts and the plan are I32; all on the device. Every call runs on the process
// compute stream (a null Stream), because the heap's sync() is queued there. The CPU version checks expert_counts
// against topk_idx on the host; here that would need a host copy, so the caller must pass route_counts of this
// topk_idx. Payload bytes are not counted: the CPU version counts them by reading route_index on the host, which a
// captured step cannot do (dispatch_bytes_moved() reports 0 for this backend).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/comm/symmetric_heap.h"
#include "moe/model/dispatch.h"

namespace moe {

class CudaRowwiseDispatcher final : public TokenDispatcher {
 public:
  // Largest EP group: the peer table is passed to every kernel by value (one NVL72 domain).
  static constexpr int kMaxRanks = 72;

  // ep_group: an NCCL communicator over the ranks of this EP group (one NVLink domain); rank r holds experts [r*E,
  // (r+1)*E). Other communicators are refused.
  CudaRowwiseDispatcher(Communicator& ep_group, int64_t num_experts, double capacity_factor, bool dropless);

  const char* name() const override { return "rowwise"; }
  int64_t expert_rows(int64_t tokens, int64_t top_k) const override;
  int64_t first_expert() const override { return ep_group_.rank() * local_experts_; }
  int64_t local_experts() const override { return local_experts_; }

  // Collective over the EP group (allocates the heap). `arena` must be a CUDA arena; nothing is reserved in it (the
  // peer table travels as a kernel parameter).
  void plan_buffers(const DispatchShape& shape, Arena& arena) override;
  Lease acquire(int layer) override;
  void release(const Lease& lease) override;
  ExpertBuffers grad_buffers() override;

  void plan(const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts, Stream stream) override;
  void dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) override;
  void combine(Tensor out, Tensor expert_out, Tensor weights, const RoutePlan& plan, int top_k, Stream stream) override;
  void combine_backward(Tensor d_expert_out, Tensor dweights, Tensor dout, Tensor expert_out, Tensor weights,
                        const RoutePlan& plan, int top_k, Stream stream) override;
  void dispatch_backward(Tensor dx, Tensor d_expert_in, const RoutePlan& plan, int top_k, Stream stream) override;

 private:
  Tensor heap_tensor(size_t offset) const;
 public:
  size_t heap_bytes() const override { return heap_ ? heap_->bytes_per_rank() : 0; }

 private:
  // Checks that `t` is a [rows, D] buffer of the heap (shape dtype) and returns its heap offset.
  size_t heap_offset(const Tensor& t, const char* op, const char* what) const;
  void check_tokens(const Tensor& t, int64_t cols, DType dtype, const char* op, const char* what) const;
  void check_call(const RoutePlan& plan, int top_k, Stream stream, const char* op) const;

  Communicator& ep_group_;
  int64_t num_experts_, local_experts_;
  double capacity_factor_;
  bool dropless_;
  int64_t tokens_ = 0, top_k_ = 0, hidden_ = 0, rows_ = 0;
  DType dtype_ = DType::BF16;
  std::unique_ptr<SymmetricHeap> heap_;
  std::vector<char*> peer_bases_;                              // [P]: the heap segment of each rank (device addresses)
  size_t buffer_bytes_ = 0;                                    // one [rows, D] buffer, aligned
  size_t counts_offset_[2] = {0, 0};                           // two [P][N] i32 count areas, used in turn (see plan())
  size_t first_buffer_offset_ = 0;                             // expert buffers start here
  int plans_ = 0;                                              // plan() calls so far: picks the count area
  std::vector<std::vector<std::pair<size_t, size_t>>> slots_;  // [layer][slot] -> heap offsets (in, out)
  std::pair<size_t, size_t> grad_slots_{};                     // heap offsets (d_expert_in, d_expert_out)
  LeasePools pools_;
};

}  // namespace moe

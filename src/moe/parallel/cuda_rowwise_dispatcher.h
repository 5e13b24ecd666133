// The rowwise dispatcher on GPUs: the same algorithm and sync schedule as
// RowwiseDispatcher (rowwise_dispatcher.h), over a SymmetricHeap of NCCL registered windows. Kernels store each routed
// row straight into the owner's expert_in through its LSA pointer (PUT) and load each expert result straight from the
// owner's expert_out (GET).
//
// Counts are agreed on the device: place_routes() stores this rank's expert_counts [N] into slot [me] of every rank's
// count area in the heap ([P][N] i32), syncs the heap, and one kernel computes the route index and the local expert
// offsets from the gathered counts (the placement of placement.h: tail drop local-expert-major, then source rank, then
// (t, k) order). Nothing is copied to the host and nothing waits on it, so every call can be captured in a CUDA graph.
// With one GPU it runs with EP = 1 through the same kernels (the peer table has one entry). With payload fp8
// (ep.payload) dispatch_fp8 stores each token row's FP8 codes and scales instead (quantized once per token).
//
// Sync schedule per MoE layer (every rank makes the same calls in the same order):
//   forward:  place_routes: PUT counts, SYNC, route index | dispatch: PUT expert_in, SYNC | experts (local) |
//             combine: SYNC, GET expert_out
//   backward: combine_backward: PUT d_expert_out, GET expert_out, SYNC | experts (local) |
//             dispatch_backward: SYNC, GET d_expert_in, SYNC
// With recompute (train.recompute = block) the backward opens with dispatch again (PUT into the shared recompute
// expert_in, SYNC) and the recomputed experts, and combine_backward of the recompute pair's expert_out opens with a SYNC.
// The hazard each sync removes is written next to it in cuda_rowwise_dispatcher.cu (NOTES:).
//
// Contract: tokens (x, out, dout, dx) and expert rows have the shape's dtype (BF16 on the GPU; F32 also works); weights
// and dweights are F32; topk_idx, expert_counts and the plan are I32; all on the device. Every call runs on the process
// compute stream (a null Stream), because the heap's sync() is queued there.
//
// Checks and counters on the device. The CPU version checks expert_counts against topk_idx on the host and counts the
// bytes it moves by reading route_index; here either would need a host copy inside the step. Instead the route-index
// kernel (which reads every count involved, plus one more pass over topk_idx per expert for its histogram) writes them
// into a small status record in this rank's heap segment: it adds the payload bytes of the rows each placement keeps (once for the dispatch, once for the combine, the same
// figure the CPU version counts in those two calls; route_payload_bytes), and it records the first count it finds wrong: expert_counts not
// the histogram of topk_idx, or agreed counts that are inconsistent (a rank's counts not T*K routes in all or
// negative, or this rank's own row not arriving intact), with the layer. check_after_step() reads the record once after
// the step (one 56-byte copy, when the device is idle anyway), publishes the byte totals through bytes_moved() and
// throws naming the layer. The kernel arguments (layer, record address) are fixed, so a captured step replays them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/comm/symmetric_heap.h"
#include "moe/parallel/expert_buffers.h"

namespace moe {

class CudaRowwiseDispatcher final : public PooledDispatcher {
 public:
  // Largest EP group: the peer table is passed to every kernel by value (one NVL72 domain).
  static constexpr int kMaxRanks = 72;

  // ep_group: an NCCL communicator over the ranks of this EP group (one NVLink domain); rank r holds experts [r*E,
  // (r+1)*E). Other communicators are refused.
  CudaRowwiseDispatcher(Communicator& ep_group, int64_t num_experts, double capacity_factor, bool dropless);

  const char* name() const override { return "rowwise"; }
  bool routes_stay_local() const override { return ep_group_.size() == 1; }

  // Collective over the EP group (allocates the heap; on a plans_only() group, only sizes it). `arena` must be a
  // CUDA arena; nothing is reserved in it (the peer table travels as a kernel parameter).
  void reserve_buffers(const DispatchShape& shape, Arena& arena) override;
  size_t heap_bytes() const override { return heap_ ? heap_->bytes_per_rank() : planned_heap_bytes_; }

  void place_routes(int layer, const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts, Stream stream) override;
  void dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) override;
  void dispatch_fp8(Fp8Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) override;
  void combine(Tensor out, Tensor expert_out, Tensor weights, const RoutePlan& plan, int top_k, Stream stream) override;
  void combine_backward(Tensor d_expert_out, Tensor dweights, Tensor dout, Tensor expert_out, Tensor weights,
                        const RoutePlan& plan, int top_k, Stream stream) override;
  void dispatch_backward(Tensor dx, Tensor d_expert_in, const RoutePlan& plan, int top_k, Stream stream) override;

  // Reads the device status record (the device must be idle, as after the trainer's read of the step statistics):
  // bytes_moved() then reports the totals so far; a count the route-index kernel found wrong throws, naming the layer
  // and the count, and is cleared.
  void check_after_step() override;

 private:
  // Checks that `t` is a [rows, D] buffer of the heap (shape dtype) and returns its heap offset.
  size_t heap_offset(const Tensor& t, const char* op, const char* what) const;
  // The same for a [rows, cols] buffer of `dtype` (dispatch_fp8's codes and scales).
  size_t heap_offset(const Tensor& t, DType dtype, int64_t cols, const char* op, const char* what) const;
  void check_tokens(const Tensor& t, int64_t cols, DType dtype, const char* op, const char* what) const;
  void check_call(const RoutePlan& plan, int top_k, Stream stream, const char* op) const;
  // out[t] (+= when accumulate, else =) sum over kept k, ascending, of (weights ? weights[t,k] : 1) times the route's
  // row of the heap buffer at rows_offset, loaded from its owner's segment (GET): the combine and the dispatch
  // backward. expert_rows is this rank's copy of that buffer (its alignment picks the word width).
  void sum_peer_routes(Tensor out, const Tensor& expert_rows, size_t rows_offset, const float* weights, bool accumulate,
                       const RoutePlan& plan, int top_k);

  Communicator& ep_group_;
  DType dtype_ = DType::BF16;
  HeapLayout layout_{Device::CUDA};  // count areas, status record, then every expert buffer
  std::unique_ptr<SymmetricHeap> heap_;
  size_t planned_heap_bytes_ = 0;  // plans_only(): the heap a run would allocate
  std::vector<char*> peer_bases_;  // [P]: the heap segment of each rank (device addresses)
  int count_areas_[2] = {-1, -1};  // two [P][N] i32 count areas, used in turn (see place_routes())
  int status_ = -1;                // the device status record (byte counters, first wrong count)
  size_t first_buffer_offset_ = 0; // expert buffers start here
  int placements_ = 0;             // place_routes() calls so far: picks the count area
};

}  // namespace moe

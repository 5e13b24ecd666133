// The EP = 1 dispatcher: all experts are on this rank, so dispatch and combine are the
// permutation kernels without communication. Capacity and tail drop follow the same rule as
// the multi-rank backends (rank_capacity = ceil(capacity_factor * T * K), or T * K when dropless).
#pragma once

#include <utility>
#include <vector>

#include "moe/model/dispatch.h"

namespace moe {

class LocalDispatcher final : public TokenDispatcher {
 public:
  LocalDispatcher(int64_t num_experts, double capacity_factor, bool dropless)
      : num_experts_(num_experts), capacity_factor_(capacity_factor), dropless_(dropless) {}

  const char* name() const override { return "local"; }
  int64_t expert_rows(int64_t tokens, int64_t top_k) const override;
  int64_t first_expert() const override { return 0; }
  int64_t local_experts() const override { return num_experts_; }

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

 private:
  int64_t num_experts_;
  double capacity_factor_;
  bool dropless_;
  Arena* arena_ = nullptr;
  LeasePools pools_;
  std::vector<std::vector<std::pair<Arena::Slot, Arena::Slot>>> slots_;  // [layer][slot] -> (in, out)
  std::pair<Arena::Slot, Arena::Slot> grad_slots_;
};

}  // namespace moe

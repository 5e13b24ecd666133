// The EP = 1 dispatcher: all experts are on this rank, so dispatch and combine are the
// permutation kernels without communication. Capacity and tail drop follow the same rule as
// the multi-rank backends (rank_capacity with one rank); its buffers come from the arena. With
// payload fp8 the scatter quantizes each token row on its way (scatter_rows_to_routes_fp8).
#pragma once

#include <optional>

#include "moe/parallel/expert_buffers.h"

namespace moe {

class LocalDispatcher final : public PooledDispatcher {
 public:
  LocalDispatcher(int64_t num_experts, double capacity_factor, bool dropless)
      : PooledDispatcher("local dispatcher", /*ranks=*/1, /*rank=*/0, num_experts, capacity_factor, dropless) {}

  const char* name() const override { return "local"; }
  bool routes_stay_local() const override { return true; }
  void reserve_buffers(const DispatchShape& shape, Arena& arena) override;

  void place_routes(int layer, const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts, Stream stream) override;
  void dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) override;
  void dispatch_fp8(Fp8Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) override;
  void combine(Tensor out, Tensor expert_out, Tensor weights, const RoutePlan& plan, int top_k,
               Stream stream) override;
  void combine_backward(Tensor d_expert_out, Tensor dweights, Tensor dout, Tensor expert_out, Tensor weights,
                        const RoutePlan& plan, int top_k, Stream stream) override;
  void dispatch_backward(Tensor dx, Tensor d_expert_in, const RoutePlan& plan, int top_k, Stream stream) override;

 private:
  std::optional<ArenaMemory> memory_;
};

}  // namespace moe

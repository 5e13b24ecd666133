#include "moe/parallel/local_dispatcher.h"

#include <cmath>
#include <string>

#include "moe/ops/permute.h"
#include "moe/ops/route.h"

namespace moe {

int64_t LocalDispatcher::expert_rows(int64_t tokens, int64_t top_k) const {
  const int64_t worst = tokens * top_k;
  if (dropless_) return worst;
  // Never more rows than routes exist: a capacity factor > 1 only matters across ranks.
  const auto cap = static_cast<int64_t>(std::ceil(capacity_factor_ * static_cast<double>(worst)));
  return cap < worst ? cap : worst;
}

void LocalDispatcher::plan_buffers(const DispatchShape& shape, Arena& arena) {
  arena_ = &arena;
  const int64_t rows = expert_rows(shape.tokens, shape.top_k), D = shape.hidden;
  pools_.init(shape.num_layers, shape.slots_per_layer);
  slots_.assign(static_cast<size_t>(shape.num_layers), {});
  for (int l = shape.first_layer; l < shape.num_layers; ++l)
    for (int s = 0; s < shape.slots_per_layer; ++s) {
      const std::string p = "dispatch.layer." + std::to_string(l) + ".slot." + std::to_string(s) + ".";
      slots_[static_cast<size_t>(l)].emplace_back(arena.reserve(p + "expert_in", shape.dtype, {rows, D}),
                                                  arena.reserve(p + "expert_out", shape.dtype, {rows, D}));
    }
  grad_slots_ = {arena.reserve("dispatch.grad.expert_in", shape.dtype, {rows, D}),
                 arena.reserve("dispatch.grad.expert_out", shape.dtype, {rows, D})};
}

Lease LocalDispatcher::acquire(int layer) {
  Lease lease;
  lease.layer = layer;
  lease.slot = pools_.take(layer);
  const auto& [in, out] = slots_[static_cast<size_t>(layer)][static_cast<size_t>(lease.slot)];
  lease.buffers = {arena_->get(in), arena_->get(out)};
  return lease;
}

void LocalDispatcher::release(const Lease& lease) { pools_.give_back(lease.layer, lease.slot); }

ExpertBuffers LocalDispatcher::grad_buffers() { return {arena_->get(grad_slots_.first), arena_->get(grad_slots_.second)}; }

void LocalDispatcher::plan(const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts, Stream stream) {
  const int64_t tokens = topk_idx.dim(0), top_k = topk_idx.dim(1);
  route_index_local(plan.route_index, plan.expert_offsets, topk_idx, expert_counts, expert_rows(tokens, top_k),
                    stream);
}

void LocalDispatcher::dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) {
  scatter_rows_to_routes(expert_in, x, plan.route_index, top_k, stream);
}

void LocalDispatcher::combine(Tensor out, Tensor expert_out, Tensor weights, const RoutePlan& plan, int top_k,
                              Stream stream) {
  combine_rows(out, expert_out, weights, plan.route_index, top_k, /*accumulate=*/true, stream);
}

void LocalDispatcher::combine_backward(Tensor d_expert_out, Tensor dweights, Tensor dout, Tensor expert_out,
                                       Tensor weights, const RoutePlan& plan, int top_k, Stream stream) {
  combine_rows_backward(d_expert_out, dweights, dout, expert_out, weights, plan.route_index, top_k, stream);
}

void LocalDispatcher::dispatch_backward(Tensor dx, Tensor d_expert_in, const RoutePlan& plan, int top_k,
                                        Stream stream) {
  scatter_rows_to_routes_backward(dx, d_expert_in, plan.route_index, top_k, /*accumulate=*/false, stream);
}

}  // namespace moe

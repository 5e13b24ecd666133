#include "moe/parallel/local_dispatcher.h"

#include "moe/core/error.h"
#include "moe/ops/permute.h"
#include "moe/ops/route.h"

namespace moe {

void LocalDispatcher::reserve_buffers(const DispatchShape& shape, Arena& arena) {
  memory_.emplace(arena);
  reserve_pools(*memory_, shape, shape.dtype);
}

void LocalDispatcher::place_routes(int layer, const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts,
                                   Stream stream) {
  const int64_t tokens = topk_idx.dim(0), top_k = topk_idx.dim(1);
  // The CPU route_index_local checks expert_counts against topk_idx; name the layer when it fails.
  try {
    route_index_local(plan.route_index, plan.expert_offsets, topk_idx, expert_counts, expert_rows(tokens, top_k),
                      stream);
  } catch (const Error& e) {
    MOE_FAIL("local dispatcher, MoE layer ", layer, ": ", e.what());
  }
}

void LocalDispatcher::dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) {
  scatter_rows_to_routes(expert_in, x, plan.route_index, top_k, stream);
}

void LocalDispatcher::dispatch_fp8(Fp8Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) {
  check_fp8_expert_rows(expert_in, "dispatch_fp8");
  scatter_rows_to_routes_fp8(expert_in, x, plan.route_index, top_k, stream);
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

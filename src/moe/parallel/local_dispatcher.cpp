#include "moe/parallel/local_dispatcher.h"

#include <cmath>

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

void LocalDispatcher::plan(const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts, Stream stream) {
  const int64_t tokens = topk_idx.dim(0), top_k = topk_idx.dim(1);
  route_index_local(plan.route_index, plan.expert_offsets, topk_idx, expert_counts, expert_rows(tokens, top_k),
                    stream);
}

void LocalDispatcher::dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) {
  gather_rows(expert_in, x, plan.route_index, top_k, stream);
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
  gather_rows_backward(dx, d_expert_in, plan.route_index, top_k, /*accumulate=*/false, stream);
}

}  // namespace moe

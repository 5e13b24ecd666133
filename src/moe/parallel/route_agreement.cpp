#include "moe/parallel/route_agreement.h"

#include <algorithm>

#include "moe/core/error.h"

namespace moe {

void RouteAgreement::reserve(Communicator& ep_group, Arena& arena, int64_t num_experts, int64_t rows,
                             const char* backend) {
  ep_group_ = &ep_group;
  arena_ = &arena;
  num_experts_ = num_experts;
  rows_ = rows;
  backend_ = backend;
  gathered_counts_ = arena.reserve("dispatch.gathered_expert_counts", DType::I32, {ep_group.size() * num_experts});
}

void RouteAgreement::place(int layer, const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts) {
  MOE_CHECK(arena_ != nullptr, backend_, " dispatcher: place_routes before reserve_buffers");
  const Tensor gathered_counts = arena_->get(gathered_counts_);
  const int P = ep_group_->size(), me = ep_group_->rank();
  const int64_t N = num_experts_, E = N / P;
  MOE_CHECK(topk_idx.dtype == DType::I32 && topk_idx.ndim() == 2, backend_, " dispatcher (rank ", me,
            "): topk_idx must be [T, K] i32, got ", topk_idx.shape.str());
  const int64_t T = topk_idx.dim(0), K = topk_idx.dim(1);
  MOE_CHECK(expert_counts.dtype == DType::I32 && expert_counts.numel() == N, backend_, " dispatcher (rank ", me,
            "): expert_counts must be [", N, "] i32, got ", expert_counts.shape.str());
  MOE_CHECK(plan.route_index.dtype == DType::I32 && plan.route_index.numel() == T * K, backend_, " dispatcher (rank ",
            me, "): route_index must be [", T * K, "] i32, got ", plan.route_index.shape.str());
  MOE_CHECK(plan.expert_offsets.dtype == DType::I32 && plan.expert_offsets.numel() == E + 1, backend_,
            " dispatcher (rank ", me, "): expert_offsets must be [", E + 1, "] i32 (local experts + 1), got ",
            plan.expert_offsets.shape.str());
  MOE_CHECK(gathered_counts.numel() == P * N, backend_, " dispatcher: count buffer is not [P*N]");
  // Agreement: every rank gets every rank's counts, so every rank computes the same placement.
  ep_group_->all_gather(gathered_counts, expert_counts);
  // Every rank sees the same gathered counts, so every rank fails here together when one rank's
  // counts are off (no rank is left waiting in a later sync).
  const int32_t* counts = gathered_counts.i32();
  for (int s = 0; s < P; ++s) {
    int64_t routes = 0;
    for (int64_t n = 0; n < N; ++n) {
      MOE_CHECK(counts[s * N + n] >= 0, backend_, " dispatcher (rank ", me, "), MoE layer ", layer, ": rank ", s,
                " reports ", counts[s * N + n], " routes to expert ", n, "; pass route_counts of its topk_idx");
      routes += counts[s * N + n];
    }
    MOE_CHECK(routes == T * K, backend_, " dispatcher (rank ", me, "), MoE layer ", layer, ": rank ", s,
              "'s expert_counts add up to ", routes, " routes, but every rank routes T*K = ", T * K,
              "; pass route_counts of its topk_idx");
  }
  compute_placement(placement_, counts, P, N, rows_);
  try {
    assign_routes(plan.route_index.i32(), topk_idx.i32(), T, K, placement_, expert_counts.i32(), me);
  } catch (const Error& e) {
    MOE_FAIL(backend_, " dispatcher, MoE layer ", layer, ": ", e.what());
  }
  const int32_t* mine = placement_.offsets_of(me);
  std::copy(mine, mine + E + 1, plan.expert_offsets.i32());
}

}  // namespace moe

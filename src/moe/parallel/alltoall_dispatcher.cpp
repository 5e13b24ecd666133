#include "moe/parallel/alltoall_dispatcher.h"

#include <cstring>

#include "moe/core/error.h"
#include "moe/ops/cpu/route_rows.h"
#include "moe/parallel/route_agreement.h"

namespace moe {

namespace {

// Route i's row in a packed route-side buffer (route_pos: Layout::route_pos), or nullptr for a
// dropped route.
struct PackedRowOf {
  const int32_t* route_pos;
  float* rows;
  int64_t hidden;
  float* operator()(int64_t i) const { return route_pos[i] < 0 ? nullptr : rows + route_pos[i] * hidden; }
};

}  // namespace

AllToAllDispatcher::AllToAllDispatcher(Communicator& ep_group, int64_t num_experts, double capacity_factor,
                                       bool dropless)
    : PooledDispatcher("alltoall dispatcher", ep_group.size(), ep_group.rank(), num_experts, capacity_factor,
                       dropless),
      ep_group_(ep_group) {
  send_elems_.resize(static_cast<size_t>(ranks_));
  recv_elems_.resize(static_cast<size_t>(ranks_));
}

void AllToAllDispatcher::reserve_buffers(const DispatchShape& shape, Arena& arena) {
  require_host_f32_rows(shape, arena);
  MOE_CHECK(shape.payload == Payload::BF16, "alltoall dispatcher: moves activation-dtype rows only; ep.payload = "
            "\"fp8\" is built for ep.backend = \"rowwise\" (set ep.payload = \"bf16\" to keep alltoall)");
  arena_ = &arena;
  memory_.emplace(arena);
  reserve_pools(*memory_, shape, DType::F32);
  agreement_.reserve(ep_group_, arena, num_experts_, rows_, "alltoall");
  route_buf_slot_ = arena.reserve("dispatch.alltoall.route_rows", DType::F32, {tokens_ * top_k_, hidden_});
  stage_slot_ = arena.reserve("dispatch.alltoall.expert_rows", DType::F32, {rows_, hidden_});
}

void AllToAllDispatcher::place_routes(int layer, const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts,
                                      Stream) {
  MOE_CHECK(arena_ != nullptr, "alltoall dispatcher: place_routes before reserve_buffers");
  check_reserved_topk(topk_idx);
  agreement_.place(layer, plan, topk_idx, expert_counts);
  const Placement& placement = agreement_.placement();
  route_buf_ = arena_->get(route_buf_slot_);
  stage_ = arena_->get(stage_slot_);

  const int P = ranks_, me = rank_;
  const int64_t E = local_experts_, routes = tokens_ * top_k_;
  Layout& L = layouts_[plan.route_index.data];
  L.route_pos.resize(static_cast<size_t>(routes));
  L.route_counts.assign(static_cast<size_t>(P), 0);
  L.expert_counts.assign(static_cast<size_t>(P), 0);
  L.expert_rows.resize(static_cast<size_t>(rows_));
  // Route side: the rows for d are packed in d's row order: local expert, then token order. So
  // route j of expert e sits at displ[d] + (kept rows of d's experts before e from us) + j,
  // i.e. displ[d] + (its row - the first row we fill at d).
  std::vector<int64_t>& first_row = displ_scratch_;  // [P]: where d's rows start in the packed buffer
  first_row.assign(static_cast<size_t>(P), 0);
  int64_t displ = 0;
  for (int d = 0; d < P; ++d) {
    L.route_counts[static_cast<size_t>(d)] = placement.kept_from(d, me);
    first_row[static_cast<size_t>(d)] = displ;
    displ += L.route_counts[static_cast<size_t>(d)];
  }
  L.route_total = displ;
  const int32_t* index = plan.route_index.i32();
  const int32_t* idx = topk_idx.i32();
  // prefix[d*E + e] = kept rows from us for d's local experts before e.
  std::vector<int64_t>& prefix = prefix_scratch_;
  prefix.assign(static_cast<size_t>(P * E), 0);
  for (int d = 0; d < P; ++d) {
    int64_t acc = 0;
    for (int64_t e = 0; e < E; ++e) {
      prefix[static_cast<size_t>(d * E + e)] = acc;
      acc += placement.kept_of(d, e, me);
    }
  }
  for (int64_t i = 0; i < routes; ++i) {
    const int32_t v = index[i];
    if (v < 0) {
      L.route_pos[static_cast<size_t>(i)] = -1;
      continue;
    }
    const int d = static_cast<int>(v / rows_);
    const int64_t e = idx[i] % E, j = v % rows_ - placement.start_of(d, e, me);
    L.route_pos[static_cast<size_t>(i)] =
        static_cast<int32_t>(first_row[static_cast<size_t>(d)] + prefix[static_cast<size_t>(d * E + e)] + j);
  }
  // Expert side: from each source s (in rank order) its rows arrive in our row order restricted to s.
  int64_t n = 0;
  for (int s = 0; s < P; ++s) {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t start = placement.start_of(me, e, s), kept = placement.kept_of(me, e, s);
      for (int64_t j = 0; j < kept; ++j) L.expert_rows[static_cast<size_t>(n++)] = static_cast<int32_t>(start + j);
    }
    L.expert_counts[static_cast<size_t>(s)] = placement.kept_from(me, s);
  }
  L.expert_total = n;
  // Counted here, not in dispatch and combine, so a dispatch repeated in backward (recompute) is not counted twice.
  count_bytes(L);
}

const AllToAllDispatcher::Layout& AllToAllDispatcher::layout_of(const RoutePlan& plan, const char* op) const {
  const auto it = layouts_.find(plan.route_index.data);
  MOE_CHECK(it != layouts_.end(), "alltoall dispatcher ", op, " (rank ", rank_,
            "): this route plan's route_index was not written by place_routes()");
  return it->second;
}

void AllToAllDispatcher::send_to_experts(const Layout& L, float* expert_rows) {
  const int P = ranks_;
  for (int r = 0; r < P; ++r) {
    send_elems_[static_cast<size_t>(r)] = L.route_counts[static_cast<size_t>(r)] * hidden_;
    recv_elems_[static_cast<size_t>(r)] = L.expert_counts[static_cast<size_t>(r)] * hidden_;
  }
  ep_group_.all_to_all_v(stage_.rows(0, L.expert_total), recv_elems_, route_buf_.rows(0, L.route_total), send_elems_);
  const int64_t D = hidden_;
  const size_t row_bytes = static_cast<size_t>(D) * sizeof(float);
  const float* recv = stage_.f32();
  const int32_t* rows = L.expert_rows.data();
  for (int64_t i = 0; i < L.expert_total; ++i) std::memcpy(expert_rows + rows[i] * D, recv + i * D, row_bytes);
}

float* AllToAllDispatcher::send_to_routes(const Layout& L, const float* expert_rows) {
  const int64_t D = hidden_;
  const size_t row_bytes = static_cast<size_t>(D) * sizeof(float);
  float* send = stage_.f32();
  const int32_t* rows = L.expert_rows.data();
  for (int64_t i = 0; i < L.expert_total; ++i) std::memcpy(send + i * D, expert_rows + rows[i] * D, row_bytes);
  const int P = ranks_;
  for (int r = 0; r < P; ++r) {
    send_elems_[static_cast<size_t>(r)] = L.expert_counts[static_cast<size_t>(r)] * hidden_;
    recv_elems_[static_cast<size_t>(r)] = L.route_counts[static_cast<size_t>(r)] * hidden_;
  }
  ep_group_.all_to_all_v(route_buf_.rows(0, L.route_total), recv_elems_, stage_.rows(0, L.expert_total), send_elems_);
  return route_buf_.f32();
}

void AllToAllDispatcher::count_bytes(const Layout& L) {
  const auto row_bytes = static_cast<int64_t>(hidden_ * sizeof(float));
  const int64_t remote = L.route_total - L.route_counts[static_cast<size_t>(rank_)];
  count_moved(2 * L.route_total * row_bytes, 2 * remote * row_bytes);  // once in dispatch, once in combine
}

void AllToAllDispatcher::dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream) {
  const Layout& L = layout_of(plan, "dispatch");
  check_f32_expert_rows(expert_in, "dispatch", "expert_in");
  check_f32_tokens(x, hidden_, "dispatch", "x");
  check_top_k(top_k, "dispatch");
  cpu::route_rows::scatter_routes(x.f32(), static_cast<size_t>(hidden_) * sizeof(float), tokens_, top_k, hidden_,
                                  PackedRowOf{L.route_pos.data(), route_buf_.f32(), hidden_});
  send_to_experts(L, expert_in.f32());
}

void AllToAllDispatcher::dispatch_fp8(Fp8Tensor, Tensor, const RoutePlan&, int, Stream) {
  MOE_FAIL("alltoall dispatcher: dispatch_fp8 with buffers reserved for ep.payload = \"bf16\" (it does not move "
           "FP8 rows; use ep.backend = \"rowwise\")");
}

void AllToAllDispatcher::combine(Tensor out, Tensor expert_out, Tensor weights, const RoutePlan& plan, int top_k,
                                 Stream) {
  const Layout& L = layout_of(plan, "combine");
  check_f32_expert_rows(expert_out, "combine", "expert_out");
  check_f32_tokens(out, hidden_, "combine", "out");
  check_f32_tokens(weights, top_k_, "combine", "weights");
  check_top_k(top_k, "combine");
  float* route_rows = send_to_routes(L, expert_out.f32());
  cpu::route_rows::sum_routes(out.f32(), weights.f32(), tokens_, top_k, hidden_, /*accumulate=*/true,
                              PackedRowOf{L.route_pos.data(), route_rows, hidden_});
}

void AllToAllDispatcher::combine_backward(Tensor d_expert_out, Tensor dweights, Tensor dout, Tensor expert_out,
                                          Tensor weights, const RoutePlan& plan, int top_k, Stream) {
  const Layout& L = layout_of(plan, "combine_backward");
  check_f32_expert_rows(d_expert_out, "combine_backward", "d_expert_out");
  check_f32_expert_rows(expert_out, "combine_backward", "expert_out");
  check_f32_tokens(dout, hidden_, "combine_backward", "dout");
  check_f32_tokens(weights, top_k_, "combine_backward", "weights");
  check_f32_tokens(dweights, top_k_, "combine_backward", "dweights");
  check_top_k(top_k, "combine_backward");
  // The expert outputs travel back again for the combine-weight gradient (rowwise loads them
  // from the owner the same way), then the weighted output gradients travel to the experts. Each
  // received expert output row is used up by its dot product, so its weighted gradient replaces it.
  const PackedRowOf route_row{L.route_pos.data(), send_to_routes(L, expert_out.f32()), hidden_};
  cpu::route_rows::combine_backward_routes(dweights.f32(), dout.f32(), weights.f32(), tokens_, top_k, hidden_,
                                           route_row, route_row);
  send_to_experts(L, d_expert_out.f32());
}

void AllToAllDispatcher::dispatch_backward(Tensor dx, Tensor d_expert_in, const RoutePlan& plan, int top_k, Stream) {
  const Layout& L = layout_of(plan, "dispatch_backward");
  check_f32_expert_rows(d_expert_in, "dispatch_backward", "d_expert_in");
  check_f32_tokens(dx, hidden_, "dispatch_backward", "dx");
  check_top_k(top_k, "dispatch_backward");
  float* route_rows = send_to_routes(L, d_expert_in.f32());
  cpu::route_rows::sum_routes(dx.f32(), nullptr, tokens_, top_k, hidden_, /*accumulate=*/false,
                              PackedRowOf{L.route_pos.data(), route_rows, hidden_});
}

}  // namespace moe

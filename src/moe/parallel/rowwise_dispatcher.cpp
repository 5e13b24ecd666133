#include "moe/parallel/rowwise_dispatcher.h"

#include <cstring>

#include "moe/core/error.h"
#include "moe/ops/cpu/route_rows.h"
#include "moe/parallel/route_agreement.h"

namespace moe {

namespace {

// Route i's row in its owner's copy of a heap buffer (peers: the buffer on each rank, from
// resolve_peers), or nullptr for a dropped route. route_index holds owner * rows + row; a row has
// row_elems elements.
template <typename Elem>
struct PeerRowOf {
  const int32_t* route_index;
  Elem* const* peers;
  int64_t rows, row_elems;
  Elem* operator()(int64_t i) const {
    const int32_t v = route_index[i];
    return v < 0 ? nullptr : peers[v / rows] + (v % rows) * row_elems;
  }
};

}  // namespace

RowwiseDispatcher::RowwiseDispatcher(Communicator& ep_group, int64_t num_experts, double capacity_factor,
                                     bool dropless)
    : PooledDispatcher("rowwise dispatcher", ep_group.size(), ep_group.rank(), num_experts, capacity_factor, dropless),
      ep_group_(ep_group) {
  peer_rows_.resize(static_cast<size_t>(ranks_));
  peer_rows_2_.resize(static_cast<size_t>(ranks_));
}

void RowwiseDispatcher::reserve_buffers(const DispatchShape& shape, Arena& arena) {
  require_host_f32_rows(shape, arena);
  reserve_pools(layout_, shape, DType::F32);  // dense layers get no buffers
  agreement_.reserve(ep_group_, arena, num_experts_, rows_, "rowwise");
  if (ep_group_.plans_only()) {  // memory planning: the heap's size, nothing allocated
    planned_heap_bytes_ = layout_.bytes();
    return;
  }
  heap_ = make_mpi_symmetric_heap(ep_group_, layout_.bytes());
  std::memset(heap_->local(), 0, heap_->bytes_per_rank());
  layout_.bind(heap_->local());
  // NOTES: peers start storing into our segment in their first dispatch; this sync makes sure
  // nobody's first PUT can land before (and be wiped by) the owner's zero-fill above.
  heap_->sync();
}

template <typename Elem>
void RowwiseDispatcher::peer_addresses(std::vector<Elem*>& peers, const Tensor& t, const char* op,
                                       const char* what) const {
  MOE_CHECK(heap_ != nullptr, "rowwise dispatcher ", op, ": called before reserve_buffers");
  const char* base = static_cast<const char*>(heap_->local());
  const char* p = static_cast<const char*>(t.data);
  MOE_CHECK(p >= base && p + t.nbytes() <= base + heap_->bytes_per_rank(), "rowwise dispatcher ", op, " (rank ",
            rank_, "): ", what,
            " is not a buffer of the dispatcher's symmetric heap; pass a lease's buffers or grad_buffers()");
  peers.resize(static_cast<size_t>(ranks_));
  for (int r = 0; r < ranks_; ++r) peers[static_cast<size_t>(r)] = static_cast<Elem*>(heap_->peer(p, r));
}

void RowwiseDispatcher::resolve_peers(std::vector<float*>& peers, const Tensor& t, const char* op,
                                      const char* what) {
  check_f32_expert_rows(t, op, what);
  peer_addresses(peers, t, op, what);
}

void RowwiseDispatcher::count_bytes(const RoutePlan& plan) {
  const int32_t* index = plan.route_index.i32();
  const int64_t route_bytes = route_payload_bytes(hidden_, DType::F32, payload_);
  int64_t rows = 0, remote_rows = 0;
  for (int64_t i = 0; i < plan.route_index.numel(); ++i) {
    if (index[i] < 0) continue;
    ++rows;
    if (index[i] / rows_ != rank_) ++remote_rows;
  }
  count_moved(rows * route_bytes, remote_rows * route_bytes);  // each way once: dispatch and combine
}

void RowwiseDispatcher::place_routes(int layer, const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts, Stream) {
  MOE_CHECK(heap_ != nullptr, "rowwise dispatcher: place_routes before reserve_buffers");
  check_reserved_topk(topk_idx);
  agreement_.place(layer, plan, topk_idx, expert_counts);
  // Counted here, not in dispatch and combine, so a dispatch repeated in backward (recompute) is not counted twice.
  count_bytes(plan);
}

void RowwiseDispatcher::dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream) {
  resolve_peers(peer_rows_, expert_in, "dispatch", "expert_in");
  check_f32_tokens(x, hidden_, "dispatch", "x");
  MOE_CHECK(top_k == top_k_ && plan.route_index.numel() == tokens_ * top_k_, "rowwise dispatch: route_index ",
            plan.route_index.shape.str(), " / top_k ", top_k, " do not match the plan");
  // NOTES: no sync before the PUTs. The rows we overwrite in a peer's expert_in were last read by
  // that peer's expert GEMMs (forward, the weight gradient or a recompute in backward) of the
  // lease's previous holder (of the recompute pair: the layer that used it last); the peer
  // finished those reads before entering a later sync (the opening sync of combine or of
  // dispatch_backward) that we have passed too, since syncs are collective and matched in order.
  cpu::route_rows::scatter_routes(x.f32(), static_cast<size_t>(hidden_) * sizeof(float), tokens_, top_k, hidden_,
                                  PeerRowOf<float>{plan.route_index.i32(), peer_rows_.data(), rows_, hidden_});
  // NOTES: the owners' expert GEMMs read expert_in next; this sync completes every rank's PUTs
  // (each kept row has exactly one writer) before any owner reads.
  heap_->sync();
}

void RowwiseDispatcher::dispatch_fp8(Fp8Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream) {
  check_fp8_expert_rows(expert_in, "dispatch_fp8");
  peer_addresses(peer_codes_, expert_in.codes, "dispatch_fp8", "expert_in codes");
  peer_addresses(peer_rows_2_, expert_in.scales, "dispatch_fp8", "expert_in scales");
  check_f32_tokens(x, hidden_, "dispatch_fp8", "x");
  check_top_k(top_k, "dispatch_fp8");
  const int64_t tiles = expert_in.scales.dim(1);
  // NOTES: no sync before the PUTs, as in dispatch: the last readers of these rows (the owners'
  // expert GEMMs and weight-gradient dequantize) finished before a sync we have passed.
  const int32_t* index = plan.route_index.i32();
  cpu::route_rows::scatter_routes_fp8(x.f32(), tokens_, top_k, hidden_,
                                      PeerRowOf<uint8_t>{index, peer_codes_.data(), rows_, hidden_},
                                      PeerRowOf<float>{index, peer_rows_2_.data(), rows_, tiles});
  // NOTES: the owners' expert GEMMs read expert_in next; complete every rank's PUTs first.
  heap_->sync();
}

void RowwiseDispatcher::combine(Tensor out, Tensor expert_out, Tensor weights, const RoutePlan& plan, int top_k,
                                Stream) {
  resolve_peers(peer_rows_, expert_out, "combine", "expert_out");
  check_f32_tokens(out, hidden_, "combine", "out");
  check_f32_tokens(weights, top_k_, "combine", "weights");
  check_top_k(top_k, "combine");
  // NOTES: every owner must have finished writing expert_out (its down-projection GEMM) before we
  // load from it. No closing sync is needed: an owner writes this slot's expert_out again only after
  // the dispatch sync of a later use of the slot, which we enter only after these loads.
  heap_->sync();
  cpu::route_rows::sum_routes(out.f32(), weights.f32(), tokens_, top_k, hidden_, /*accumulate=*/true,
                              PeerRowOf<float>{plan.route_index.i32(), peer_rows_.data(), rows_, hidden_});
}

void RowwiseDispatcher::combine_backward(Tensor d_expert_out, Tensor dweights, Tensor dout, Tensor expert_out,
                                         Tensor weights, const RoutePlan& plan, int top_k, Stream) {
  resolve_peers(peer_rows_, d_expert_out, "combine_backward", "d_expert_out");
  resolve_peers(peer_rows_2_, expert_out, "combine_backward", "expert_out");
  check_f32_tokens(dout, hidden_, "combine_backward", "dout");
  check_f32_tokens(weights, top_k_, "combine_backward", "weights");
  check_f32_tokens(dweights, top_k_, "combine_backward", "dweights");
  check_top_k(top_k, "combine_backward");
  // NOTES: no opening sync for a lease. (1) The d_expert_out rows we store into were last read by
  // the owner's expert GEMMs of the previous MoE backward, which precede that backward's
  // dispatch_backward syncs, which we have passed. (2) expert_out (GET, for dweights) was completed
  // before the combine sync of this lease's forward; the lease keeps it from being overwritten.
  // The recompute pair's expert_out is different: the owner has just rewritten it (the recomputed
  // down projection, after the re-dispatch sync), so every owner must finish that before we load.
  if (is_recompute_buffer(expert_out)) heap_->sync();
  const int32_t* index = plan.route_index.i32();
  cpu::route_rows::combine_backward_routes(dweights.f32(), dout.f32(), weights.f32(), tokens_, top_k, hidden_,
                                           PeerRowOf<float>{index, peer_rows_2_.data(), rows_, hidden_},
                                           PeerRowOf<float>{index, peer_rows_.data(), rows_, hidden_});
  // NOTES: the owners' GEMMs read d_expert_out next; complete every rank's PUTs first.
  heap_->sync();
}

void RowwiseDispatcher::dispatch_backward(Tensor dx, Tensor d_expert_in, const RoutePlan& plan, int top_k, Stream) {
  resolve_peers(peer_rows_, d_expert_in, "dispatch_backward", "d_expert_in");
  check_f32_tokens(dx, hidden_, "dispatch_backward", "dx");
  check_top_k(top_k, "dispatch_backward");
  // NOTES: every owner must have finished writing d_expert_in (its data-gradient GEMM) before we
  // load from it.
  heap_->sync();
  cpu::route_rows::sum_routes(dx.f32(), nullptr, tokens_, top_k, hidden_, /*accumulate=*/false,
                              PeerRowOf<float>{plan.route_index.i32(), peer_rows_.data(), rows_, hidden_});
  // NOTES: once we return, the owner may write d_expert_in again (the next MoE layer's backward,
  // or any caller's use of grad_buffers()); this sync keeps that write behind every rank's loads.
  // (In the transformer's order combine_backward's closing sync would also cover it; the interface
  // does not promise that order, so the dispatcher does not rely on it.)
  heap_->sync();
}

}  // namespace moe

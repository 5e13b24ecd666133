#include "moe/parallel/rowwise_dispatcher.h"

#include <cstring>
#include <string>

#include "moe/core/error.h"
#include "moe/parallel/ep_plan.h"
#include "moe/parallel/routed_rows.h"

namespace moe {

namespace {
constexpr size_t kHeapAlign = 256;
size_t align_up(size_t n) { return (n + kHeapAlign - 1) / kHeapAlign * kHeapAlign; }
}  // namespace

RowwiseDispatcher::RowwiseDispatcher(Communicator& ep_group, int64_t num_experts, double capacity_factor,
                                     bool dropless)
    : ep_group_(ep_group),
      num_experts_(num_experts),
      local_experts_(0),
      capacity_factor_(capacity_factor),
      dropless_(dropless) {
  const int P = ep_group.size();
  MOE_CHECK(num_experts >= 1 && num_experts % P == 0, "rowwise dispatcher: ", num_experts,
            " experts do not split evenly over an EP group of ", P, " ranks (parallel.ep)");
  local_experts_ = num_experts / P;
  peer_rows_.resize(static_cast<size_t>(P));
  peer_rows_2_.resize(static_cast<size_t>(P));
}

int64_t RowwiseDispatcher::expert_rows(int64_t tokens, int64_t top_k) const {
  return ep_rank_capacity(tokens, top_k, ep_group_.size(), capacity_factor_, dropless_);
}

void RowwiseDispatcher::plan_buffers(const DispatchShape& shape, Arena& arena) {
  MOE_CHECK(shape.dtype == DType::F32 && arena.device() == Device::CPU, "rowwise dispatcher: moves F32 rows in host "
            "memory (MPI); GPU activations (BF16) need the NCCL backend, which this build does not have yet");
  MOE_CHECK(heap_ == nullptr, "rowwise dispatcher: plan_buffers called twice");
  arena_ = &arena;
  tokens_ = shape.tokens, top_k_ = shape.top_k, hidden_ = shape.hidden;
  rows_ = expert_rows(tokens_, top_k_);
  const int P = ep_group_.size();
  gathered_counts_ = arena.reserve("dispatch.gathered_expert_counts", DType::I32, {P * num_experts_});
  pools_.init(shape.num_layers, shape.slots_per_layer);
  buffer_bytes_ = align_up(static_cast<size_t>(rows_ * hidden_) * sizeof(float));
  size_t at = 0;
  auto next = [&] {
    const size_t offset = at;
    at += buffer_bytes_;
    return offset;
  };
  slots_.assign(static_cast<size_t>(shape.num_layers), {});
  for (int l = shape.first_layer; l < shape.num_layers; ++l)  // dense layers get no buffers
    for (int s = 0; s < shape.slots_per_layer; ++s) {
      const size_t in = next(), out = next();
      slots_[static_cast<size_t>(l)].emplace_back(in, out);
    }
  const size_t d_in = next(), d_out = next();
  grad_slots_ = {d_in, d_out};
  heap_ = make_mpi_symmetric_heap(ep_group_, at > 0 ? at : kHeapAlign);
  std::memset(heap_->local(), 0, heap_->bytes_per_rank());
  // NOTES: peers start storing into our segment in their first dispatch; this sync makes sure
  // nobody's first PUT can land before (and be wiped by) the owner's zero-fill above.
  heap_->sync();
}

Tensor RowwiseDispatcher::heap_tensor(size_t offset) const {
  return Tensor(static_cast<char*>(heap_->local()) + offset, DType::F32, {rows_, hidden_});
}

Lease RowwiseDispatcher::acquire(int layer) {
  MOE_CHECK(heap_ != nullptr, "rowwise dispatcher: acquire before plan_buffers");
  // NOTES: PUTs address a peer's buffer by our own (layer, slot); that is the same buffer on the
  // peer because every rank runs the same schedule, so LeasePools hands out the same slot everywhere.
  Lease lease;
  lease.layer = layer;
  lease.slot = pools_.take(layer);
  const auto& [in, out] = slots_[static_cast<size_t>(layer)][static_cast<size_t>(lease.slot)];
  lease.buffers = {heap_tensor(in), heap_tensor(out)};
  return lease;
}

void RowwiseDispatcher::release(const Lease& lease) { pools_.give_back(lease.layer, lease.slot); }

ExpertBuffers RowwiseDispatcher::grad_buffers() {
  MOE_CHECK(heap_ != nullptr, "rowwise dispatcher: grad_buffers before plan_buffers");
  return {heap_tensor(grad_slots_.first), heap_tensor(grad_slots_.second)};
}

void RowwiseDispatcher::resolve_peers(std::vector<float*>& peers, const Tensor& t, const char* op,
                                      const char* what) {
  MOE_CHECK(heap_ != nullptr, "rowwise dispatcher ", op, ": called before plan_buffers");
  const char* base = static_cast<const char*>(heap_->local());
  const char* p = static_cast<const char*>(t.data);
  MOE_CHECK(p >= base && p + buffer_bytes_ <= base + heap_->bytes_per_rank(), "rowwise dispatcher ", op, " (rank ",
            ep_group_.rank(), "): ", what,
            " is not a buffer of the dispatcher's symmetric heap; pass a lease's buffers or grad_buffers()");
  MOE_CHECK(t.dtype == DType::F32 && t.ndim() == 2 && t.dim(0) == rows_ && t.dim(1) == hidden_,
            "rowwise dispatcher ", op, ": ", what, " must be [", rows_, ", ", hidden_, "] F32, got ", t.shape.str());
  for (int r = 0; r < ep_group_.size(); ++r) peers[static_cast<size_t>(r)] = static_cast<float*>(heap_->peer(p, r));
}

void RowwiseDispatcher::check_tokens(const Tensor& t, int64_t cols, const char* op, const char* what) const {
  MOE_CHECK(t.dtype == DType::F32 && t.ndim() == 2 && t.dim(0) == tokens_ && t.dim(1) == cols, "rowwise dispatcher ",
            op, ": ", what, " must be [", tokens_, ", ", cols, "] F32, got ", t.shape.str());
}

void RowwiseDispatcher::count_bytes(const RoutePlan& plan) {
  const int32_t* index = plan.route_index.i32();
  const int me = ep_group_.rank();
  const auto row_bytes = static_cast<int64_t>(hidden_ * sizeof(float));
  for (int64_t i = 0; i < plan.route_index.numel(); ++i) {
    if (index[i] < 0) continue;
    bytes_moved_ += row_bytes;
    if (index[i] / rows_ != me) remote_bytes_moved_ += row_bytes;
  }
}

void RowwiseDispatcher::plan(const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts, Stream) {
  MOE_CHECK(heap_ != nullptr, "rowwise dispatcher: plan before plan_buffers");
  MOE_CHECK(topk_idx.ndim() == 2 && topk_idx.dim(0) == tokens_ && topk_idx.dim(1) == top_k_,
            "rowwise dispatcher: topk_idx ", topk_idx.shape.str(), " does not match the planned [", tokens_, ", ",
            top_k_, "]");
  ep_plan(ep_group_, placement_, arena_->get(gathered_counts_), plan, topk_idx, expert_counts, num_experts_, rows_,
          "rowwise");
}

void RowwiseDispatcher::dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream) {
  resolve_peers(peer_rows_, expert_in, "dispatch", "expert_in");
  check_tokens(x, hidden_, "dispatch", "x");
  MOE_CHECK(top_k == top_k_ && plan.route_index.numel() == tokens_ * top_k_, "rowwise dispatch: route_index ",
            plan.route_index.shape.str(), " / top_k ", top_k, " do not match the plan");
  // NOTES: no sync before the PUTs. The rows we overwrite in a peer's expert_in were last read by
  // that peer's expert GEMMs (forward, or the weight gradient in backward) of the lease's previous
  // holder; the peer finished those reads before entering a later sync (the opening sync of
  // combine or of dispatch_backward) that we have passed too, since syncs are collective and
  // matched in order.
  const int32_t* index = plan.route_index.i32();
  const float* xs = x.f32();
  const int64_t D = hidden_, rows = rows_;
  const size_t row_bytes = static_cast<size_t>(D) * sizeof(float);
  float* const* peers = peer_rows_.data();
#pragma omp parallel for schedule(static) if (tokens_ * top_k_ * D >= routed::kMinParallelWork)
  for (int64_t t = 0; t < tokens_; ++t)
    for (int k = 0; k < top_k; ++k) {
      const int32_t v = index[t * top_k + k];
      if (v < 0) continue;
      std::memcpy(peers[v / rows] + (v % rows) * D, xs + t * D, row_bytes);
    }
  count_bytes(plan);
  // NOTES: the owners' expert GEMMs read expert_in next; this sync completes every rank's PUTs
  // (each kept row has exactly one writer) before any owner reads.
  heap_->sync();
}

void RowwiseDispatcher::combine(Tensor out, Tensor expert_out, Tensor weights, const RoutePlan& plan, int top_k,
                                Stream) {
  resolve_peers(peer_rows_, expert_out, "combine", "expert_out");
  check_tokens(out, hidden_, "combine", "out");
  check_tokens(weights, top_k_, "combine", "weights");
  MOE_CHECK(top_k == top_k_, "rowwise combine: top_k ", top_k, " does not match the plan's ", top_k_);
  // NOTES: every owner must have finished writing expert_out (its down-projection GEMM) before we
  // load from it. No closing sync is needed: an owner writes this slot's expert_out again only after
  // the dispatch sync of a later use of the slot, which we enter only after these loads.
  heap_->sync();
  const int32_t* index = plan.route_index.i32();
  const int64_t D = hidden_, rows = rows_;
  float* const* peers = peer_rows_.data();
  routed::sum_routes(out.f32(), weights.f32(), tokens_, top_k, D, /*accumulate=*/true,
                     [&](int64_t i) -> const float* {
                       const int32_t v = index[i];
                       return v < 0 ? nullptr : peers[v / rows] + (v % rows) * D;
                     });
  count_bytes(plan);
}

void RowwiseDispatcher::combine_backward(Tensor d_expert_out, Tensor dweights, Tensor dout, Tensor expert_out,
                                         Tensor weights, const RoutePlan& plan, int top_k, Stream) {
  resolve_peers(peer_rows_, d_expert_out, "combine_backward", "d_expert_out");
  resolve_peers(peer_rows_2_, expert_out, "combine_backward", "expert_out");
  check_tokens(dout, hidden_, "combine_backward", "dout");
  check_tokens(weights, top_k_, "combine_backward", "weights");
  check_tokens(dweights, top_k_, "combine_backward", "dweights");
  MOE_CHECK(top_k == top_k_, "rowwise combine_backward: top_k ", top_k, " does not match the plan's ", top_k_);
  // NOTES: no opening sync. (1) The d_expert_out rows we store into were last read by the owner's
  // expert GEMMs of the previous MoE backward, which precede that backward's dispatch_backward
  // syncs, which we have passed. (2) expert_out (GET, for dweights) was completed before the
  // combine sync of this lease's forward; the lease keeps it from being overwritten.
  const int32_t* index = plan.route_index.i32();
  const float* g = dout.f32();
  const float* w = weights.f32();
  float* dw = dweights.f32();
  const int64_t D = hidden_, rows = rows_;
  float* const* d_out_peers = peer_rows_.data();
  float* const* out_peers = peer_rows_2_.data();
#pragma omp parallel for schedule(static) if (tokens_ * top_k_ * D >= routed::kMinParallelWork)
  for (int64_t t = 0; t < tokens_; ++t)
    for (int k = 0; k < top_k; ++k) {
      const int64_t i = t * top_k + k;
      const int32_t v = index[i];
      if (v < 0) {
        dw[i] = 0.0f;
        continue;
      }
      const int64_t offset = (v % rows) * D;
      dw[i] = routed::dot_row(g + t * D, out_peers[v / rows] + offset, D);
      routed::scale_row(d_out_peers[v / rows] + offset, w[i], g + t * D, D);
    }
  // NOTES: the owners' GEMMs read d_expert_out next; complete every rank's PUTs first.
  heap_->sync();
}

void RowwiseDispatcher::dispatch_backward(Tensor dx, Tensor d_expert_in, const RoutePlan& plan, int top_k, Stream) {
  resolve_peers(peer_rows_, d_expert_in, "dispatch_backward", "d_expert_in");
  check_tokens(dx, hidden_, "dispatch_backward", "dx");
  MOE_CHECK(top_k == top_k_, "rowwise dispatch_backward: top_k ", top_k, " does not match the plan's ", top_k_);
  // NOTES: every owner must have finished writing d_expert_in (its data-gradient GEMM) before we
  // load from it.
  heap_->sync();
  const int32_t* index = plan.route_index.i32();
  const int64_t D = hidden_, rows = rows_;
  float* const* peers = peer_rows_.data();
  routed::sum_routes(dx.f32(), nullptr, tokens_, top_k, D, /*accumulate=*/false, [&](int64_t i) -> const float* {
    const int32_t v = index[i];
    return v < 0 ? nullptr : peers[v / rows] + (v % rows) * D;
  });
  // NOTES: once we return, the owner may write d_expert_in again (the next MoE layer's backward,
  // or any caller's use of grad_buffers()); this sync keeps that write behind every rank's loads.
  // (In the transformer's order combine_backward's closing sync would also cover it; the interface
  // does not promise that order, so the dispatcher does not rely on it.)
  heap_->sync();
}

}  // namespace moe

#include "moe/parallel/expert_buffers.h"

#include <cmath>

#include "moe/core/error.h"

namespace moe {

int64_t rank_capacity(int64_t tokens, int64_t top_k, int ranks, double capacity_factor, bool dropless) {
  MOE_CHECK(tokens >= 0 && top_k >= 1 && ranks >= 1, "rank capacity: bad shape (tokens ", tokens, ", top_k ", top_k,
            ", ranks ", ranks, ")");
  const int64_t worst = tokens * top_k * ranks;
  if (dropless) return worst;
  MOE_CHECK(capacity_factor > 0.0, "model.capacity_factor = ", capacity_factor,
            " must be positive (or set model.dropless = true)");
  const double cap = std::ceil(capacity_factor * static_cast<double>(tokens * top_k));
  return cap < static_cast<double>(worst) ? static_cast<int64_t>(cap) : worst;
}

int64_t route_payload_bytes(int64_t hidden, DType dtype, Payload payload) {
  const auto row = hidden * static_cast<int64_t>(dtype_size(dtype));
  if (payload == Payload::BF16) return 2 * row;
  const int64_t tiles = (hidden + kFp8Tile - 1) / kFp8Tile;
  return hidden + tiles * static_cast<int64_t>(sizeof(float)) + row;
}

int ArenaMemory::reserve(const std::string& name, DType dtype, Shape shape) {
  slots_.push_back(arena_.reserve(name, dtype, shape));
  return static_cast<int>(slots_.size()) - 1;
}

int HeapLayout::reserve(const std::string& /*name*/, DType dtype, Shape shape) {
  MOE_CHECK(base_ == nullptr, "heap layout: reserve after the heap was bound");
  entries_.push_back({end_, dtype, shape});
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  end_ += (bytes + kAlign - 1) / kAlign * kAlign;
  return static_cast<int>(entries_.size()) - 1;
}

Tensor HeapLayout::get(int id) const {
  MOE_CHECK(base_ != nullptr, "heap layout: buffer ", id, " used before the heap was allocated");
  const Entry& e = entries_.at(static_cast<size_t>(id));
  return Tensor(base_ + e.offset, e.dtype, e.shape, device_);
}

void ExpertBufferPools::reserve(BufferMemory& memory, const ExpertPoolSizes& sizes) {
  MOE_CHECK(memory_ == nullptr, "expert buffer pools reserved twice");
  MOE_CHECK(sizes.slots_per_layer >= 1, "lease pools need at least one slot per layer (parallel.lease_slots)");
  MOE_CHECK(sizes.first_layer >= 0 && sizes.first_layer <= sizes.num_layers, "expert buffer pools: first MoE layer ",
            sizes.first_layer, " is outside [0, ", sizes.num_layers, "]");
  memory_ = &memory;
  sizes_ = sizes;
  const Shape shape{sizes.rows, sizes.hidden};
  const Shape scales_shape = fp8_scale_shape(shape, Fp8Tiles::Rows);
  auto pair = [&](const std::string& prefix, Payload payload, bool with_out = true) {
    Slot s;
    if (payload == Payload::FP8) {
      s.in = memory.reserve(prefix + "expert_in", DType::FP8_E4M3, shape);
      s.in_scales = memory.reserve(prefix + "expert_in_scales", DType::F32, scales_shape);
    } else {
      s.in = memory.reserve(prefix + "expert_in", sizes.dtype, shape);
    }
    if (with_out) s.out = memory.reserve(prefix + "expert_out", sizes.dtype, shape);
    return s;
  };
  if (sizes.recompute) {
    recompute_ = pair("dispatch.recompute.", sizes.payload);
  } else {
    pools_.assign(static_cast<size_t>(sizes.num_layers - sizes.first_layer), {});
    for (int l = sizes.first_layer; l < sizes.num_layers; ++l)
      for (int s = 0; s < sizes.slots_per_layer; ++s)
        pools_[static_cast<size_t>(l - sizes.first_layer)].push_back(
            pair("dispatch.layer." + std::to_string(l) + ".slot." + std::to_string(s) + ".", sizes.payload));
  }
  grad_ = pair("dispatch.grad.", Payload::BF16, sizes.grad_expert_out);  // gradients stay in the activation dtype
}

ExpertBuffers ExpertBufferPools::buffers_of(const Slot& s) const {
  ExpertBuffers b{memory_->get(s.in), s.out >= 0 ? memory_->get(s.out) : Tensor(), Tensor()};
  if (s.in_scales >= 0) b.expert_in_scales = memory_->get(s.in_scales);
  return b;
}

std::vector<ExpertBufferPools::Slot>& ExpertBufferPools::pool_of(int layer, const char* op) {
  MOE_CHECK(memory_ != nullptr, "expert buffers: ", op, " before the dispatcher reserved its buffers");
  MOE_CHECK(!sizes_.recompute, "no lease pool for layer ", layer,
            ": every MoE layer recomputes its expert rows in backward (train.recompute = \"block\") and uses the "
            "shared recompute buffers");
  MOE_CHECK(layer >= sizes_.first_layer && layer < sizes_.num_layers, "no lease pool for layer ", layer,
            ": expert buffers exist for the MoE layers ", sizes_.first_layer, "..", sizes_.num_layers - 1);
  return pools_[static_cast<size_t>(layer - sizes_.first_layer)];
}

Lease ExpertBufferPools::acquire(int layer) {
  std::vector<Slot>& pool = pool_of(layer, "acquire");
  for (size_t s = 0; s < pool.size(); ++s)
    if (!pool[s].busy) {
      pool[s].busy = true;
      Lease lease;
      lease.layer = layer;
      lease.slot = static_cast<int>(s);
      lease.buffers = buffers_of(pool[s]);
      return lease;
    }
  MOE_FAIL("lease pool 'layer ", layer, " expert buffers' is exhausted: all ", sizes_.slots_per_layer,
           " slot(s) are held by microbatches whose backward has not run; raise parallel.lease_slots "
           "(microbatches in flight at once)");
}

void ExpertBufferPools::release(const Lease& lease) {
  std::vector<Slot>& pool = pool_of(lease.layer, "release");
  MOE_CHECK(lease.slot >= 0 && lease.slot < static_cast<int>(pool.size()) && pool[static_cast<size_t>(lease.slot)].busy,
            "release of a lease (layer ", lease.layer, ", slot ", lease.slot, ") that is not held");
  pool[static_cast<size_t>(lease.slot)].busy = false;
}

ExpertBuffers ExpertBufferPools::grad_buffers() const {
  MOE_CHECK(memory_ != nullptr, "expert buffers: grad_buffers before the dispatcher reserved its buffers");
  return buffers_of(grad_);
}

ExpertBuffers ExpertBufferPools::recompute_buffers() const {
  MOE_CHECK(memory_ != nullptr, "expert buffers: recompute_buffers before the dispatcher reserved its buffers");
  MOE_CHECK(sizes_.recompute, "expert buffers: recompute_buffers of a dispatcher reserved with lease pools "
            "(the MoE layers keep their expert rows; reserve with DispatchShape::recompute)");
  return buffers_of(recompute_);
}

bool ExpertBufferPools::is_recompute_buffer(const Tensor& t) const {
  if (!sizes_.recompute || t.data == nullptr) return false;
  const char* p = static_cast<const char*>(t.data);
  for (const int id : {recompute_.in, recompute_.out, recompute_.in_scales}) {
    if (id < 0) continue;
    const Tensor b = memory_->get(id);
    const char* base = static_cast<const char*>(b.data);
    if (p >= base && p < base + b.nbytes()) return true;
  }
  return false;
}

namespace {
int64_t experts_per_rank(const std::string& what, int64_t num_experts, int ranks) {
  MOE_CHECK(ranks >= 1 && num_experts >= 1 && num_experts % ranks == 0, what, ": ", num_experts,
            " experts do not split evenly over an EP group of ", ranks, " ranks (parallel.ep)");
  return num_experts / ranks;
}
}  // namespace

PooledDispatcher::PooledDispatcher(std::string what, int ranks, int rank, int64_t num_experts, double capacity_factor,
                                   bool dropless)
    : what_(std::move(what)),
      ranks_(ranks),
      rank_(rank),
      num_experts_(num_experts),
      local_experts_(experts_per_rank(what_, num_experts, ranks)),
      capacity_factor_(capacity_factor),
      dropless_(dropless) {}

int64_t PooledDispatcher::expert_rows(int64_t tokens, int64_t top_k) const {
  return rank_capacity(tokens, top_k, ranks_, capacity_factor_, dropless_);
}

void PooledDispatcher::reserve_pools(BufferMemory& memory, const DispatchShape& shape, DType dtype) {
  MOE_CHECK(!pools_.reserved(), what_, ": reserve_buffers called twice");
  tokens_ = shape.tokens, top_k_ = shape.top_k, hidden_ = shape.hidden;
  payload_ = shape.payload;
  rows_ = expert_rows(shape.tokens, shape.top_k);
  pools_.reserve(memory, {shape.first_layer, shape.num_layers, shape.slots_per_layer, rows_, shape.hidden, dtype,
                          shape.recompute, shape.payload, shape.grad_expert_out});
}

void PooledDispatcher::require_host_f32_rows(const DispatchShape& shape, const Arena& arena) const {
  MOE_CHECK(shape.dtype == DType::F32 && arena.device() == Device::CPU, what_,
            ": moves F32 rows in host memory (MPI); GPU runs use the rowwise dispatcher on NCCL (make_gpu_dispatcher)");
}

void PooledDispatcher::check_f32_expert_rows(const Tensor& t, const char* op, const char* what) const {
  MOE_CHECK(t.dtype == DType::F32 && t.ndim() == 2 && t.dim(0) == rows_ && t.dim(1) == hidden_, what_, " ", op, ": ",
            what, " must be [", rows_, ", ", hidden_, "] F32, got ", t.shape.str());
}

void PooledDispatcher::check_fp8_expert_rows(const Fp8Tensor& t, const char* op) const {
  MOE_CHECK(payload_ == Payload::FP8, what_, " ", op, ": its expert_in buffers were reserved for ", to_string(payload_),
            " rows (ep.payload = \"fp8\", or FP8 with every route on the rank, reserves FP8 rows), not fp8");
  const Shape scales = fp8_scale_shape({rows_, hidden_}, Fp8Tiles::Rows);
  MOE_CHECK(t.tiles == Fp8Tiles::Rows && t.codes.dtype == DType::FP8_E4M3 && t.codes.ndim() == 2 &&
                t.codes.dim(0) == rows_ && t.codes.dim(1) == hidden_ && t.scales.dtype == DType::F32 &&
                t.scales.shape == scales,
            what_, " ", op, ": expert_in must be FP8 rows: codes [", rows_, ", ", hidden_, "] FP8_E4M3 and scales ",
            scales.str(), " F32 (a lease's fp8_expert_in()), got codes ", t.codes.shape.str(), " ",
            dtype_name(t.codes.dtype), " and scales ", t.scales.shape.str(), " ", dtype_name(t.scales.dtype));
}

void PooledDispatcher::check_f32_tokens(const Tensor& t, int64_t cols, const char* op, const char* what) const {
  MOE_CHECK(t.dtype == DType::F32 && t.ndim() == 2 && t.dim(0) == tokens_ && t.dim(1) == cols, what_, " ", op, ": ",
            what, " must be [", tokens_, ", ", cols, "] F32, got ", t.shape.str());
}

void PooledDispatcher::check_top_k(int top_k, const char* op) const {
  MOE_CHECK(top_k == top_k_, name(), " ", op, ": top_k ", top_k, " does not match the plan's ", top_k_);
}

void PooledDispatcher::check_reserved_topk(const Tensor& topk_idx) const {
  MOE_CHECK(topk_idx.ndim() == 2 && topk_idx.dim(0) == tokens_ && topk_idx.dim(1) == top_k_, what_, ": topk_idx ",
            topk_idx.shape.str(), " does not match the reserved [", tokens_, ", ", top_k_, "]");
}

Lease PooledDispatcher::acquire(int layer) {
  MOE_CHECK(pools_.reserved(), what_, ": acquire before reserve_buffers");
  return pools_.acquire(layer);
}

ExpertBuffers PooledDispatcher::grad_buffers() {
  MOE_CHECK(pools_.reserved(), what_, ": grad_buffers before reserve_buffers");
  return pools_.grad_buffers();
}

ExpertBuffers PooledDispatcher::recompute_buffers() {
  MOE_CHECK(pools_.reserved(), what_, ": recompute_buffers before reserve_buffers");
  return pools_.recompute_buffers();
}

}  // namespace moe

#include "moe/parallel/ddp_store.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "moe/core/device.h"
#include "moe/core/dtype.h"
#include "moe/core/error.h"
#include "moe/model/weights.h"
#include "moe/ops/elementwise.h"

namespace moe {

DdpStore::DdpStore(const ModelConfig& cfg, const ParamRegistry& reg, const Mesh& mesh, Arena& arena,
                   DType moment_dtype, Precision precision, GradReduceOptions reduce, StoreUse use)
    : cfg_(cfg), reg_(reg), mesh_(mesh), arena_(arena) {
  // On the GPU the model reads BF16 compute weights, refreshed from the FP32 main weights after
  // every change to them (BF16 compute, FP32 main weights, gradients and moments). In FP8 the
  // quantized matrices are read only through their FP8 caches, so the BF16 copy holds the rest
  // alone (embedding, norms, routers, LM head).
  has_compute_copy_ = arena.device() == Device::CUDA;
  // An evaluation in BF16 on the GPU reads a checkpoint straight into the BF16 copy (rounded as the
  // copy's refresh rounds): nothing reads FP32 weights. In FP8 the caches are quantized from them.
  compute_only_ = use == StoreUse::Evaluation && has_compute_copy_ && precision == Precision::BF16;
  if (!compute_only_) params_ = arena.reserve("parameters", DType::F32, {reg.total_numel()});
  if (use == StoreUse::Training) grads_slot_ = arena.reserve("gradients", DType::F32, {reg.total_numel()});
  const int64_t local_experts = cfg.num_experts / mesh.ep;
  compact_compute_ = has_compute_copy_ && precision == Precision::FP8;
  const std::vector<bool> held = held_layers(cfg, reg);  // a pipeline stage's layers
  const int64_t compute_numel =
      reg.total_numel() - (compact_compute_ ? fp8_quantized_numel(cfg, local_experts, held) : 0);
  if (has_compute_copy_) compute_ = arena.reserve("compute_weights", DType::BF16, {compute_numel});
  if (use == StoreUse::Training)
    optimizer_ =
        std::make_unique<DistributedAdamW>(reg, mesh, arena, moment_dtype, reduce.bucket_bytes, reduce.overlap);
  if (precision == Precision::FP8) fp8_ = std::make_unique<Fp8WeightCache>(cfg, local_experts, arena, held);
  buckets_completed_by_block_.assign(static_cast<size_t>(cfg.num_hidden_layers) + 2, {});
  if (optimizer_ && optimizer_->overlaps_reduction()) plan_bucket_starts();
}

DistributedAdamW& DdpStore::training_optimizer(const char* call) const {
  MOE_CHECK(optimizer_, "DdpStore::", call, ": this store holds an evaluation's weights only (no gradients, no "
            "optimizer state)");
  return *optimizer_;
}

// Backward runs blocks L+1 (final norm; the LM head's gradient is written in the forward) down to
// 0 (embedding), so a bucket is complete after the backward of the lowest block it reads from.
// Every rank of a group has the same layout, so every rank starts the same buckets in the same
// order, as the collectives require.
void DdpStore::plan_bucket_starts() {
  const auto& entries = reg_.entries();
  std::vector<int> param_blocks(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) param_blocks[i] = param_block(cfg_, entries[i].name);
  for (int b = 0; b < static_cast<int>(optimizer_->buckets().size()); ++b) {
    int lowest = static_cast<int>(cfg_.num_hidden_layers) + 1;
    for (const auto& [begin, end] : optimizer_->bucket_inputs(b)) {
      // The parameters overlapping [begin, end): entries are in flat order.
      auto it = std::upper_bound(entries.begin(), entries.end(), begin,
                                 [](int64_t at, const ParamEntry& e) { return at < e.offset + e.numel(); });
      for (; it != entries.end() && it->offset < end; ++it)
        lowest = std::min(lowest, param_blocks[static_cast<size_t>(it - entries.begin())]);
    }
    buckets_completed_by_block_[static_cast<size_t>(lowest)].push_back(b);
  }
}

const std::vector<int>& DdpStore::buckets_started_after(int block) const {
  MOE_CHECK(block >= 0 && block < static_cast<int>(buckets_completed_by_block_.size()), "DdpStore: block ", block,
            " of ", buckets_completed_by_block_.size());
  return buckets_completed_by_block_[static_cast<size_t>(block)];
}

void DdpStore::after_backward(int block) {
  if (!reduce_in_backward_) return;
  const Tensor g = grads_flat();
  for (int b : buckets_completed_by_block_.at(static_cast<size_t>(block))) {
    optimizer_->start_reduction(b, g);
    ++started_in_backward_;
  }
}

void DdpStore::bind() {
  if (bound_) return;
  if (optimizer_) grads_ = bind_weights(cfg_, reg_, grads_flat());
  if (compute_only_) {
    weights_ = bind_weights(cfg_, reg_, arena_.get(compute_));
    bound_ = true;
    return;
  }
  master_ = bind_weights(cfg_, reg_, params());
  if (compact_compute_)
    bind_compact_copy();
  else
    weights_ = bind_weights(cfg_, reg_, has_compute_copy_ ? arena_.get(compute_) : params());
  // What the one-rank update writes in its own pass, fixed once the views are: the BF16 copy (whole,
  // or the unquantized tensors' pieces) and the FP8 caches.
  if (compact_compute_) {
    for (const auto& [master, copy] : compute_copies_) update_outputs_.bf16.push_back({master, copy});
  } else if (has_compute_copy_) {
    update_outputs_.bf16.push_back({params(), arena_.get(compute_)});
  }
  if (fp8_)
    for (const auto& [master, cache] : fp8_->targets(master_))
      update_outputs_.fp8.push_back({master, cache.w, cache.w_t});
  bound_ = true;
}

void DdpStore::bind_compact_copy() {
  // The quantized matrices' model views stay on the FP32 weights (their shapes, and the fused
  // gate/up adjacency, are what the model reads; a BF16 read of them would fail the ops' dtype
  // checks instead of reading stale values); every other tensor gets the next piece of the copy.
  const std::vector<Tensor> quantized = fp8_quantized_matrices(master_);
  const auto is_quantized = [&](const Tensor& t) {
    const char* p = static_cast<const char*>(t.data);
    for (const Tensor& q : quantized) {
      const char* b = static_cast<const char*>(q.data);
      if (p >= b && p < b + q.nbytes()) return true;
    }
    return false;
  };
  const Tensor compact = arena_.get(compute_);
  std::vector<Tensor> views(reg_.entries().size());
  int64_t used = 0;
  for (int i = 0; i < static_cast<int>(views.size()); ++i) {
    const Tensor master = reg_.view(params(), i);
    if (is_quantized(master)) {
      views[i] = master;
      continue;
    }
    const int64_t n = master.numel();
    MOE_CHECK(used + n <= compact.numel(), "DdpStore: the BF16 compute copy (", compact.numel(),
              " elements) is smaller than the unquantized weights");
    views[i] = compact.rows(used, used + n).view(master.shape);
    compute_copies_.push_back({master, views[i]});
    used += n;
  }
  MOE_CHECK(used == compact.numel(), "DdpStore: the unquantized weights hold ", used,
            " elements, the BF16 compute copy was planned for ", compact.numel());
  weights_ = bind_weights(cfg_, reg_, [&](int i) { return views[i]; });
}

void DdpStore::init(uint64_t seed) {
  bind();
  if (compute_only_) return init_compute_copy(seed);
  init_params(cfg_, reg_, params(), seed);
  refresh_compute_weights();
}

void DdpStore::init_compute_copy(uint64_t seed) {
  // The FP32 values init_params writes, a bounded chunk at a time in host memory, rounded to
  // nearest even as the GPU's cast rounds them.
  constexpr int64_t kChunk = int64_t{1} << 22;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  const Tensor copy = arena_.get(compute_);
  for (int i = 0; i < static_cast<int>(reg_.entries().size()); ++i) {
    const Tensor flat = reg_.view(copy, i).view({reg_.entry(i).numel()});
    for (int64_t c = 0; c < flat.numel(); c += kChunk) {
      const int64_t n = std::min(kChunk, flat.numel() - c);
      f32.resize(static_cast<size_t>(n));
      bf16.resize(static_cast<size_t>(n));
      init_param_range(cfg_, reg_, i, c, c + n, f32.data(), seed);
      for (int64_t k = 0; k < n; ++k) bf16[static_cast<size_t>(k)] = f32_to_bf16(f32[static_cast<size_t>(k)]);
      copy_to_tensor(flat.rows(c, c + n), bf16.data());
    }
  }
}

void DdpStore::refresh_compute_weights() {
  bind();
  if (compute_only_) return;  // the copy is the only one: nothing to refresh it from
  if (compact_compute_) {
    for (const auto& [master, copy] : compute_copies_) cast_copy(copy, master);
  } else if (has_compute_copy_) {
    cast_copy(arena_.get(compute_), params());
  }
  refresh_fp8_weights();
}

void DdpStore::refresh_fp8_weights() {
  if (fp8_) fp8_->refresh(master_);
}

void DdpStore::zero_grads(bool experts_written) {
  bind();
  // None is left after a step; a caller without one must not race them.
  training_optimizer("zero_grads").finish_reductions();
  const Tensor g = grads_flat();
  if (!experts_written) return fill_zero(g);
  // The flat buffer is [dense region | expert region]: only the dense region is zeroed.
  const auto [begin, end] = reg_.region(ReplicaGroup::Dense);
  if (end > begin)
    fill_zero(Tensor(static_cast<char*>(g.data) + begin * static_cast<int64_t>(dtype_size(g.dtype)), g.dtype,
                     {end - begin}, g.device));
}

void DdpStore::enqueue_step(const AdamWConfig& cfg, float max_norm, int64_t step, Tensor schedule) {
  reduce_in_backward_ = false;
  bind();
  // One rank: the update writes the compute weights in its own pass over the FP32 weights (the BF16
  // copy, and in FP8 the quantized matrices' caches), once per step. Several ranks: the gathered
  // weights arrive after the update, so they are refreshed from them here.
  if (!training_optimizer("enqueue_step").enqueue_step(params(), grads_flat(), cfg, max_norm, step, schedule,
                                                       update_outputs_))
    refresh_compute_weights();
}

ParamStore::StepResult DdpStore::last_step() const {
  return training_optimizer("last_step").last_result();
}

void DdpStore::reduced_gradients(const GradientFn& fn) {
  // Reductions the hooks started read the buffer reduced in place here.
  training_optimizer("reduced_gradients").finish_reductions();
  reduce_in_backward_ = false;
  const Tensor g = grads_flat();
  for (ReplicaGroup group : {ReplicaGroup::Dense, ReplicaGroup::Expert}) {
    const auto [begin, end] = reg_.region(group);
    Communicator& comm = group == ReplicaGroup::Dense ? *mesh_.world : *mesh_.expert_replicas;
    if (end > begin) comm.all_reduce(g.rows(begin, end), ReduceOp::Sum);
  }
  for (int i = 0; i < static_cast<int>(reg_.entries().size()); ++i) {
    const ParamEntry& e = reg_.entry(i);
    const Tensor gi = reg_.view(g, i);
    if (gi.device == Device::CPU) {
      fn(e.name, e.global_begin(), e.global_begin() + e.numel(), gi.f32());
      continue;
    }
    std::vector<float> host(static_cast<size_t>(gi.numel()));
    copy_from_tensor(host.data(), gi);
    fn(e.name, e.global_begin(), e.global_begin() + e.numel(), host.data());
  }
}

std::vector<CheckpointSlice> DdpStore::checkpoint_slices() const {
  DistributedAdamW& optimizer = training_optimizer("checkpoint_slices");
  std::vector<CheckpointSlice> out;
  const Tensor p = params();
  // Weights: each logical element is written by exactly one rank — dense parameters by rank 0,
  // each expert slice by the first of its replicas.
  for (int i = 0; i < static_cast<int>(reg_.entries().size()); ++i) {
    const ParamEntry& e = reg_.entry(i);
    const bool writer = e.group == ReplicaGroup::Dense ? mesh_.rank == 0 : mesh_.ep_dp_index == 0;
    if (!writer) continue;
    std::vector<int64_t> shape(e.global_shape.dims.begin(), e.global_shape.dims.begin() + e.global_shape.ndim);
    out.push_back({e.name, DType::F32, shape, e.global_begin(), e.global_begin() + e.numel(), reg_.view(p, i).data});
  }
  // Moments: sharded, so every rank writes its own pieces, in the dtype they are stored in (load()
  // converts, so a checkpoint resumes under either optim.moment_dtype).
  for (const auto& s : optimizer.moment_slices()) {
    const ParamEntry& e = *s.entry;
    std::vector<int64_t> shape(e.global_shape.dims.begin(), e.global_shape.dims.begin() + e.global_shape.ndim);
    out.push_back({e.name + ".exp_avg", s.exp_avg.dtype, shape, s.begin, s.end, s.exp_avg.data});
    out.push_back({e.name + ".exp_avg_sq", s.exp_avg_sq.dtype, shape, s.begin, s.end, s.exp_avg_sq.data});
  }
  return out;
}

void DdpStore::load_weights(const TensorReadFn& read) {
  bind();
  const Tensor p = compute_only_ ? arena_.get(compute_) : params();  // read_into rounds F32 to BF16
  for (int i = 0; i < static_cast<int>(reg_.entries().size()); ++i) {
    const ParamEntry& e = reg_.entry(i);
    read(e.name, e.global_begin(), e.global_begin() + e.numel(), reg_.view(p, i).view({e.numel()}));
  }
  refresh_compute_weights();
}

void DdpStore::load(const CheckpointReader& ckpt) {
  const TensorReadFn read = [&](const std::string& key, int64_t begin, int64_t end, const Tensor& dst) {
    ckpt.read_into(key, begin, end, dst);
  };
  load_weights(read);
  // Moments saved in either dtype are converted to this run's (read_into); an evaluation has none.
  if (optimizer_) optimizer_->load_moments(read);
}

}  // namespace moe

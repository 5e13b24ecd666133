#include "moe/parallel/fsdp_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "moe/core/device.h"
#include "moe/ops/elementwise.h"

namespace moe {

FsdpStore::FsdpStore(const ModelConfig& cfg, const ParamRegistry& reg, Communicator& world, Arena& arena,
                     DType moment_dtype, StoreUse use)
    : cfg_(cfg), reg_(reg), world_(world), arena_(arena), training_(use == StoreUse::Training) {
  MOE_CHECK(moment_dtype == DType::F32 || moment_dtype == DType::BF16, "fsdp: moments are F32 or BF16, not ",
            dtype_name(moment_dtype));
  const int nblocks = static_cast<int>(cfg.num_hidden_layers) + 2;
  blocks_.resize(static_cast<size_t>(nblocks));
  for (auto& b : blocks_) b.begin = -1;
  for (int i = 0; i < static_cast<int>(reg.entries().size()); ++i) {
    const ParamEntry& e = reg.entry(i);
    MOE_CHECK(e.local_shape == e.global_shape, "fsdp: parameter '", e.name, "' is sliced; FSDP holds all experts");
    Block& b = blocks_[static_cast<size_t>(param_block(cfg, e.name))];
    MOE_CHECK(b.begin < 0 || b.end == e.offset, "fsdp: block of '", e.name, "' is not contiguous (use ParamLayout::ByBlock)");
    if (b.begin < 0) b.begin = e.offset;
    b.end = e.offset + e.numel();
    b.params.push_back(i);
  }
  const int64_t P = world.size();
  int64_t total_shard = 0, max_shard = 0;
  for (auto& b : blocks_) {
    MOE_CHECK(b.begin >= 0, "fsdp: an empty parameter block");
    b.shard = (b.end - b.begin + P - 1) / P;
    b.shard_offset = total_shard;
    total_shard += b.shard;
    max_shard = std::max(max_shard, b.shard);
  }
  compute_ = arena.device() == Device::CUDA ? DType::BF16 : DType::F32;
  w_shard_ = arena.reserve("fsdp.weight_shards", DType::F32, {total_shard});
  if (compute_ == DType::BF16) w_shard_bf16_ = arena.reserve("fsdp.weight_shards_bf16", DType::BF16, {total_shard});
  gather_w_ = arena.reserve("fsdp.gathered_block_weights", compute_, {P * max_shard});
  if (!training_) return;  // an evaluation: the weights only
  g_shard_ = arena.reserve("fsdp.grad_shards", DType::F32, {total_shard});
  m_ = arena.reserve("fsdp.exp_avg_shards", moment_dtype, {total_shard});
  v_ = arena.reserve("fsdp.exp_avg_sq_shards", moment_dtype, {total_shard});
  grad_full_ = arena.reserve("fsdp.block_gradients", DType::F32, {P * max_shard});
  rs_tmp_ = arena.reserve("fsdp.reduce_scatter_out", DType::F32, {max_shard});
  norm_sq_ = arena.reserve("fsdp.grad_norm_sq", DType::F32, {1});
  norm_ws_ = arena.reserve("fsdp.grad_norm_workspace", DType::F32,
                           {sum_squares_workspace_elems(arena.device(), total_shard)});
}

void FsdpStore::bind() {
  if (bound_) return;
  MOE_CHECK(arena_.committed(), "fsdp: used before the arena was committed");
  const Tensor gw = arena_.get(gather_w_);
  auto into = [&](const Tensor& base) {
    return [&, base](int i) {
      const ParamEntry& e = reg_.entry(i);
      const Block& b = blocks_[static_cast<size_t>(param_block(cfg_, e.name))];
      return Tensor(static_cast<char*>(base.data) + (e.offset - b.begin) * static_cast<int64_t>(dtype_size(base.dtype)),
                    base.dtype, e.local_shape, base.device);
    };
  };
  weights_ = bind_weights(cfg_, reg_, into(gw));
  if (training_) grads_ = bind_weights(cfg_, reg_, into(arena_.get(grad_full_)));
  bound_ = true;
}

void FsdpStore::check_training(const char* call) const {
  MOE_CHECK(training_, "FsdpStore::", call, ": this store holds an evaluation's weights only (no gradients, no "
            "optimizer state)");
}

Tensor FsdpStore::compute_shards() const {
  return compute_ == DType::BF16 ? arena_.get(w_shard_bf16_) : arena_.get(w_shard_);
}

template <typename Fn>
void FsdpStore::for_each_owned_piece(Fn&& fn) const {
  const int64_t r = world_.rank();
  for (const Block& b : blocks_) {
    const int64_t lo = b.begin + r * b.shard, hi = std::min(b.end, lo + b.shard);  // this rank's range (full layout)
    for (int i : b.params) {
      const ParamEntry& e = reg_.entry(i);
      const int64_t plo = std::max(lo, e.offset), phi = std::min(hi, e.offset + e.numel());
      if (plo < phi) fn(i, plo - e.offset, phi - e.offset, b.shard_offset + (plo - lo));
    }
  }
}

void FsdpStore::init(uint64_t seed) {
  bind();
  Tensor ws = arena_.get(w_shard_);
  fill_zero(ws);  // the padding past each block's end stays zero
  // Each rank initializes only the pieces it owns (a pure function of seed, name and index), in
  // host memory, a bounded chunk at a time: a whole block of the largest models does not fit.
  constexpr int64_t kChunk = int64_t{1} << 24;
  std::vector<float> staging;
  for_each_owned_piece([&](int i, int64_t lo, int64_t hi, int64_t at) {
    for (int64_t c = lo; c < hi; c += kChunk) {
      const int64_t n = std::min(kChunk, hi - c);
      staging.resize(static_cast<size_t>(n));
      init_param_range(cfg_, reg_, i, c, c + n, staging.data(), seed);
      copy_to_tensor(ws.rows(at + (c - lo), at + (c - lo) + n), staging.data());
    }
  });
  if (compute_ == DType::BF16) cast_copy(arena_.get(w_shard_bf16_), ws);
}

// The shard mixes the blocks' parameters, experts included: always zeroed whole.
void FsdpStore::zero_grads(bool /*experts_written*/) {
  check_training("zero_grads");
  fill_zero(arena_.get(g_shard_));
}

void FsdpStore::gather(int block) {
  bind();
  const Block& b = blocks_[static_cast<size_t>(block)];
  const int64_t P = world_.size();
  Tensor shard = compute_shards().rows(b.shard_offset, b.shard_offset + b.shard);
  world_.all_gather(arena_.get(gather_w_).rows(0, P * b.shard), shard);
  bytes_gathered_ += P * b.shard * static_cast<int64_t>(dtype_size(compute_));
}

void FsdpStore::before_forward(int block) {
  gather(block);
  // The head block's gradients are produced inside the forward (the LM head runs fused with its backward).
  if (training_ && block == static_cast<int>(blocks_.size()) - 1)
    fill_zero(arena_.get(grad_full_).rows(0, world_.size() * blocks_.back().shard));
}

void FsdpStore::before_backward(int block) {
  check_training("before_backward");
  // The embedding's backward only scatters gradient rows; it does not read the table.
  if (block != 0) gather(block);
  fill_zero(arena_.get(grad_full_).rows(0, world_.size() * blocks_[static_cast<size_t>(block)].shard));
}

void FsdpStore::after_backward(int block) {
  const Block& b = blocks_[static_cast<size_t>(block)];
  const int64_t P = world_.size();
  Tensor out = arena_.get(rs_tmp_).rows(0, b.shard);
  world_.reduce_scatter(out, arena_.get(grad_full_).rows(0, P * b.shard), ReduceOp::Sum);
  add_inplace(arena_.get(g_shard_).rows(b.shard_offset, b.shard_offset + b.shard), out);
  bytes_reduced_ += P * b.shard * 4;
}

void FsdpStore::enqueue_step(const AdamWConfig& cfg, float max_norm, int64_t step, Tensor schedule) {
  check_training("enqueue_step");
  Tensor ws = arena_.get(w_shard_), gs = arena_.get(g_shard_), m = arena_.get(m_), v = arena_.get(v_);
  Tensor norm_sq = arena_.get(norm_sq_);
  fill_zero(norm_sq);
  // The shards partition every parameter: each element is counted once.
  sum_squares_accumulate(norm_sq, gs, arena_.get(norm_ws_));
  world_.all_reduce(norm_sq, ReduceOp::Sum);
  AdamWConfig no_decay = cfg;
  no_decay.weight_decay = 0.0f;
  const Tensor copy = compute_ == DType::BF16 ? arena_.get(w_shard_bf16_) : Tensor();
  for_each_owned_piece([&](int i, int64_t lo, int64_t hi, int64_t at) {
    auto piece = [&](const Tensor& t) { return t.rows(at, at + (hi - lo)); };
    // On the GPU the update also writes the BF16 shard copy the next gathers send.
    adamw_step(piece(ws), piece(gs), piece(m), piece(v), norm_sq, max_norm, reg_.entry(i).decay ? cfg : no_decay, step,
               {}, schedule, copy.empty() ? Tensor() : piece(copy));
  });
}

ParamStore::StepResult FsdpStore::last_step() const {
  check_training("last_step");
  return read_adamw_outcome(arena_.get(norm_sq_));
}

void FsdpStore::reduced_gradients(const GradientFn& fn) {
  check_training("reduced_gradients");
  // The hooks already reduce-scattered every block's gradients into the shards.
  const Tensor g = arena_.get(g_shard_);
  std::vector<float> host;
  if (g.device != Device::CPU) {
    host.resize(static_cast<size_t>(g.numel()));
    copy_from_tensor(host.data(), g);
  }
  const float* gs = g.device == Device::CPU ? g.f32() : host.data();
  for_each_owned_piece([&](int i, int64_t lo, int64_t hi, int64_t at) { fn(reg_.entry(i).name, lo, hi, gs + at); });
}

std::vector<CheckpointSlice> FsdpStore::checkpoint_slices() const {
  check_training("checkpoint_slices");
  std::vector<CheckpointSlice> out;
  const Tensor ws = arena_.get(w_shard_), m = arena_.get(m_), v = arena_.get(v_);
  // Moments in the dtype they are stored in (load() converts, so either optim.moment_dtype resumes).
  for_each_owned_piece([&](int i, int64_t lo, int64_t hi, int64_t at) {
    const ParamEntry& e = reg_.entry(i);
    std::vector<int64_t> shape(e.global_shape.dims.begin(), e.global_shape.dims.begin() + e.global_shape.ndim);
    for (const auto& [suffix, t] : {std::pair<const char*, Tensor>{"", ws}, {".exp_avg", m}, {".exp_avg_sq", v}})
      out.push_back({e.name + suffix, t.dtype, shape, lo, hi, t.rows(at, at + (hi - lo)).data});
  });
  return out;
}

void FsdpStore::load_weights(const TensorReadFn& read) {
  const Tensor ws = arena_.get(w_shard_);
  for_each_owned_piece([&](int i, int64_t lo, int64_t hi, int64_t at) {
    read(reg_.entry(i).name, lo, hi, ws.rows(at, at + (hi - lo)));
  });
  if (compute_ == DType::BF16) cast_copy(arena_.get(w_shard_bf16_), ws);
}

void FsdpStore::load(const CheckpointReader& ckpt) {
  load_weights([&](const std::string& key, int64_t begin, int64_t end, const Tensor& dst) {
    ckpt.read_into(key, begin, end, dst);
  });
  // Moments saved in either dtype are converted to this run's (read_into); an evaluation has none.
  if (!training_) return;
  const Tensor m = arena_.get(m_), v = arena_.get(v_);
  for_each_owned_piece([&](int i, int64_t lo, int64_t hi, int64_t at) {
    const std::string& name = reg_.entry(i).name;
    ckpt.read_into(name + ".exp_avg", lo, hi, m.rows(at, at + (hi - lo)));
    ckpt.read_into(name + ".exp_avg_sq", lo, hi, v.rows(at, at + (hi - lo)));
  });
}

}  // namespace moe

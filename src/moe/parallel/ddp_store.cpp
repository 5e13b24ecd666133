#include "moe/parallel/ddp_store.h"

#include "moe/ops/embedding.h"

namespace moe {

DdpStore::DdpStore(const ModelConfig& cfg, const ParamRegistry& reg, const Mesh& mesh, Arena& arena)
    : cfg_(cfg), reg_(reg), mesh_(mesh), arena_(arena) {
  params_ = arena.reserve("parameters", DType::F32, {reg.total_numel()});
  grads_slot_ = arena.reserve("gradients", DType::F32, {reg.total_numel()});
  optimizer_ = std::make_unique<DistributedAdamW>(reg, mesh, arena);
}

void DdpStore::bind() {
  if (bound_) return;
  weights_ = bind_weights(cfg_, reg_, params());
  grads_ = bind_weights(cfg_, reg_, grads_flat());
  bound_ = true;
}

void DdpStore::init(uint64_t seed) {
  bind();
  init_params(cfg_, reg_, params(), seed);
}

void DdpStore::zero_grads() {
  bind();
  fill_zero(grads_flat());
}

ParamStore::StepResult DdpStore::step(const AdamWConfig& cfg, float max_norm, int64_t step) {
  const DistributedAdamW::Result r = optimizer_->step(params(), grads_flat(), cfg, max_norm, step);
  return {r.grad_norm, r.skipped};
}

void DdpStore::reduced_gradients(const GradientFn& fn) {
  const Tensor g = grads_flat();
  for (ReplicaGroup group : {ReplicaGroup::Dense, ReplicaGroup::Expert}) {
    const auto [begin, end] = reg_.region(group);
    Communicator& comm = group == ReplicaGroup::Dense ? *mesh_.world : *mesh_.expert_replicas;
    if (end > begin) comm.all_reduce(g.rows(begin, end), ReduceOp::Sum);
  }
  for (int i = 0; i < static_cast<int>(reg_.entries().size()); ++i) {
    const ParamEntry& e = reg_.entry(i);
    fn(e.name, e.global_begin(), e.global_begin() + e.numel(), reg_.view(g, i).f32());
  }
}

std::vector<CheckpointSlice> DdpStore::checkpoint_slices() const {
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
  // Moments: sharded, so every rank writes its own pieces.
  for (const auto& s : optimizer_->moment_slices()) {
    const ParamEntry& e = *s.entry;
    std::vector<int64_t> shape(e.global_shape.dims.begin(), e.global_shape.dims.begin() + e.global_shape.ndim);
    out.push_back({e.name + ".exp_avg", DType::F32, shape, s.begin, s.end, s.exp_avg});
    out.push_back({e.name + ".exp_avg_sq", DType::F32, shape, s.begin, s.end, s.exp_avg_sq});
  }
  return out;
}

void DdpStore::load(const CheckpointReader& ckpt) {
  bind();
  const Tensor p = params();
  for (int i = 0; i < static_cast<int>(reg_.entries().size()); ++i) {
    const ParamEntry& e = reg_.entry(i);
    ckpt.read(e.name, DType::F32, e.global_begin(), e.global_begin() + e.numel(), reg_.view(p, i).data);
  }
  optimizer_->load_moments([&](const std::string& key, int64_t begin, int64_t end, float* dst) {
    ckpt.read(key, DType::F32, begin, end, dst);
  });
}

}  // namespace moe

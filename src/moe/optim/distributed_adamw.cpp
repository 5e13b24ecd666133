#include "moe/optim/distributed_adamw.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "moe/comm/timed_communicator.h"
#include "moe/core/device.h"
#include "moe/ops/elementwise.h"
#include "moe/ops/fp8_adamw.h"

namespace moe {

namespace {

// Elements [begin, begin + n) of a flat buffer (FP32 state, BF16 moments or the BF16 compute copy), as a 1-D tensor.
Tensor flat_range(const Tensor& t, int64_t begin, int64_t n) {
  MOE_CHECK(begin >= 0 && n >= 0 && begin + n <= t.numel(), "range [", begin, ", ", begin + n,
            ") outside a buffer of ", t.numel(), " elements");
  return Tensor(static_cast<char*>(t.data) + begin * static_cast<int64_t>(dtype_size(t.dtype)), t.dtype, {n},
                t.device);
}

// Where view (a range of `buffer`, same dtype) starts in buffer, in elements.
int64_t flat_offset(const Tensor& buffer, const Tensor& view) {
  const auto elem = static_cast<int64_t>(dtype_size(buffer.dtype));
  const int64_t bytes = static_cast<const char*>(view.data) - static_cast<const char*>(buffer.data);
  MOE_CHECK(view.dtype == buffer.dtype && view.device == buffer.device && bytes >= 0 && bytes % elem == 0 &&
                bytes / elem + view.numel() <= buffer.numel(),
            "DistributedAdamW: an update output's master tensor ", view.shape.str(), " is not a range of the params");
  return bytes / elem;
}

}  // namespace

// Each piece's output: the FP8 target whose master holds it (every piece of a target must be
// inside it, all with one weight decay, and together cover it), else the slice of the BF16 copy
// target that holds it.
std::vector<DistributedAdamW::PieceOutput> DistributedAdamW::map_outputs(const Tensor& params,
                                                                        const UpdateOutputs& outputs) const {
  struct Range {
    int64_t begin, end;
  };
  auto range_of = [&](const Tensor& master) {
    const int64_t b = flat_offset(params, master);
    return Range{b, b + master.numel()};
  };
  std::vector<Range> fp8_ranges, copy_ranges;
  for (const Fp8Target& t : outputs.fp8) fp8_ranges.push_back(range_of(t.master));
  for (const CopyTarget& t : outputs.bf16) copy_ranges.push_back(range_of(t.master));
  std::vector<PieceOutput> out(pieces_.size());
  std::vector<int64_t> covered(fp8_ranges.size(), 0);
  std::vector<int> decay_of(fp8_ranges.size(), -1);
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& pc = pieces_[i];
    const int64_t b = pc.flat_begin, e = pc.flat_begin + pc.n;
    auto find = [&](const std::vector<Range>& ranges, const char* what) -> int {
      for (size_t t = 0; t < ranges.size(); ++t) {
        if (b >= ranges[t].begin && e <= ranges[t].end) return static_cast<int>(t);
        MOE_CHECK(e <= ranges[t].begin || b >= ranges[t].end, "DistributedAdamW: parameter ",
                  reg_.entry(pc.param).name, " is split between ", what, " and the rest of the update");
      }
      return -1;
    };
    if (const int t = find(fp8_ranges, "an FP8 cache's weight"); t >= 0) {
      const int decay = reg_.entry(pc.param).decay ? 1 : 0;
      MOE_CHECK(decay_of[t] < 0 || decay_of[t] == decay, "DistributedAdamW: the FP8-cached matrix holding ",
                reg_.entry(pc.param).name, " mixes parameters with and without weight decay");
      out[i].fp8 = &outputs.fp8[static_cast<size_t>(t)];
      out[i].first_of_fp8 = decay_of[t] < 0;
      decay_of[t] = decay;
      covered[t] += pc.n;
      continue;
    }
    if (const int t = find(copy_ranges, "a BF16 copy's range"); t >= 0)
      out[i].copy = flat_range(outputs.bf16[static_cast<size_t>(t)].copy, b - copy_ranges[t].begin, pc.n);
  }
  for (size_t t = 0; t < fp8_ranges.size(); ++t)
    MOE_CHECK(covered[t] == fp8_ranges[t].end - fp8_ranges[t].begin, "DistributedAdamW: an FP8-cached matrix of ",
              fp8_ranges[t].end - fp8_ranges[t].begin, " elements holds ", covered[t], " elements of parameters");
  return out;
}

DistributedAdamW::DistributedAdamW(const ParamRegistry& reg, const Mesh& mesh, Arena& arena, DType moment_dtype,
                                   size_t bucket_bytes, bool overlap_reduction)
    : reg_(reg), mesh_(mesh), arena_(arena), moment_dtype_(moment_dtype) {
  MOE_CHECK(mesh.world != nullptr, "DistributedAdamW: the mesh has no world communicator");
  MOE_CHECK(moment_dtype == DType::F32 || moment_dtype == DType::BF16,
            "DistributedAdamW: moments are F32 or BF16, not ", dtype_name(moment_dtype));
  MOE_CHECK(bucket_bytes >= sizeof(float), "DistributedAdamW: bucket_bytes = ", bucket_bytes,
            " holds no FP32 element");
  bucket_elems_ = static_cast<int64_t>(bucket_bytes / sizeof(float));

  const auto expert_region = reg.region(ReplicaGroup::Expert);
  MOE_CHECK(expert_region.first == expert_region.second || mesh.expert_replicas != nullptr,
            "DistributedAdamW: the registry has expert parameters but the mesh has no expert replica group");
  dense_ = plan_shard(ReplicaGroup::Dense, mesh.world, 0);
  expert_ = plan_shard(ReplicaGroup::Expert, mesh.expert_replicas.get(), dense_.shard_numel);
  const int64_t shard_total = dense_.shard_numel + expert_.shard_numel;
  single_rank_ = mesh.world->size() == 1;

  // The pieces of each parameter that fall in this rank's shards, in flat order.
  for (int i = 0; i < static_cast<int>(reg.entries().size()); ++i) {
    const ParamEntry& e = reg.entry(i);
    const Shard& s = shard(e.group);
    const int64_t b = std::max(e.offset, s.begin), end = std::min(e.offset + e.numel(), s.end);
    if (b < end) pieces_.push_back({i, b, end - b, s.buffer_offset + (b - s.begin)});
  }

  // The buckets of step 1, and staging for one: group_size chunks of `chunk` elements each (the
  // chunk a rank contributes to / receives from one collective call).
  int64_t staging = 0, send = 0;
  for (const Shard* s : {&dense_, &expert_}) {
    if (s->shard_numel == 0) continue;
    const int64_t chunk_max = std::min(s->shard_numel, std::max<int64_t>(1, bucket_elems_ / s->group_size));
    staging = std::max(staging, chunk_max * s->group_size);
    send = std::max(send, chunk_max);
    const ReplicaGroup group = s == &dense_ ? ReplicaGroup::Dense : ReplicaGroup::Expert;
    if (!single_rank_)
      for (int64_t k0 = 0; k0 < s->shard_numel; k0 += chunk_max)
        buckets_.push_back({group, k0, std::min(chunk_max, s->shard_numel - k0)});
  }
  started_.assign(buckets_.size(), false);
  if (overlap_reduction && !single_rank_ && !mesh.world->plans_only()) {
    // Communicators of the queue's own (a split with one color is a copy of the group), so its
    // collectives never interleave with the main thread's on the same communicator. Untimed: the
    // worker thread must not add to the shared clock; the queue adds the time join() waits.
    queue_world_ = untimed(*mesh.world).split(0, mesh.world->rank());
    if (expert_.shard_numel > 0)
      queue_experts_ = untimed(*mesh.expert_replicas).split(0, mesh.expert_replicas->rank());
    const bool threaded = queue_world_->threads_may_call_concurrently() &&
                          (!queue_experts_ || queue_experts_->threads_may_call_concurrently());
    auto* timed = dynamic_cast<TimedCommunicator*>(mesh.world);
    queue_ = std::make_unique<CommQueue>(arena.device(), threaded, timed ? timed->clock() : nullptr);
  }
  m_ = arena.reserve("optimizer.exp_avg_shard", moment_dtype, {shard_total});
  v_ = arena.reserve("optimizer.exp_avg_sq_shard", moment_dtype, {shard_total});
  norm_sq_ = arena.reserve("optimizer.grad_norm_sq", DType::F32, {1});
  // The norm runs over the gradient shard (one rank: the whole gradient buffer).
  const int64_t norm_elems = single_rank_ ? reg.total_numel() : shard_total;
  norm_ws_ = arena.reserve("optimizer.grad_norm_workspace", DType::F32,
                           {sum_squares_workspace_elems(arena.device(), norm_elems)});
  if (!single_rank_) {
    grad_shard_ = arena.reserve("optimizer.grad_shard", DType::F32, {shard_total});
    staging_ = arena.reserve("optimizer.bucket_staging", DType::F32, {staging});
    send_ = arena.reserve("optimizer.gather_send", DType::F32, {send});
  }
}

DistributedAdamW::Shard DistributedAdamW::plan_shard(ReplicaGroup group, Communicator* comm, int64_t buffer_offset) {
  Shard s;
  const auto [begin, end] = reg_.region(group);
  s.region_begin = begin;
  s.region_end = end;
  s.buffer_offset = buffer_offset;
  if (begin == end) {  // no parameters of this group: no shard, no collectives
    s.begin = s.end = begin;
    return s;
  }
  s.group_size = comm->size();
  s.group_rank = comm->rank();
  const int64_t n = end - begin;
  s.shard_numel = (n + s.group_size - 1) / s.group_size;
  s.begin = std::min(end, begin + s.group_rank * s.shard_numel);
  s.end = std::min(end, s.begin + s.shard_numel);
  return s;
}

// NOTES: a bucket is not a contiguous range of the region: rank r's part of bucket k is shard
// elements [k0, k0 + chunk) of rank r's shard, so the bucket's input is gathered into staging
// (block r = rank r's part) before the collective. That one copy also supplies the zero padding
// past the region end, so the padding never needs to exist in the params or gradient buffers.
//
// Bucket [k0, k0 + chunk) covers those shard elements of every rank's shard: staging block r
// holds rank r's shard elements of that range (zeros past the region end), so one reduce_scatter
// leaves the summed block of this rank in its gradient shard. Buckets never mix the two groups.
void DistributedAdamW::reduce_bucket(const Bucket& b, Communicator* comm, const Tensor& grads, Stream stream) const {
  const Shard& s = shard(b.group);
  const Tensor staging = arena_.get(staging_), grad_shard = arena_.get(grad_shard_);
  const int p = s.group_size;
  for (int r = 0; r < p; ++r) {
    const int64_t src = s.region_begin + r * s.shard_numel + b.k0;
    const int64_t avail = std::clamp<int64_t>(s.region_end - src, 0, b.chunk);
    if (avail > 0) copy(flat_range(staging, r * b.chunk, avail), flat_range(grads, src, avail), stream);
    if (avail < b.chunk) fill_zero(flat_range(staging, r * b.chunk + avail, b.chunk - avail), stream);
  }
  comm->reduce_scatter(flat_range(grad_shard, s.buffer_offset + b.k0, b.chunk), flat_range(staging, 0, b.chunk * p),
                       ReduceOp::Sum, stream);
}

std::vector<std::pair<int64_t, int64_t>> DistributedAdamW::bucket_inputs(int i) const {
  const Bucket& b = buckets_.at(static_cast<size_t>(i));
  const Shard& s = shard(b.group);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int r = 0; r < s.group_size; ++r) {
    const int64_t src = s.region_begin + r * s.shard_numel + b.k0;
    const int64_t avail = std::clamp<int64_t>(s.region_end - src, 0, b.chunk);
    if (avail > 0) out.emplace_back(src, src + avail);
  }
  return out;
}

void DistributedAdamW::start_reduction(int i, const Tensor& grads) {
  MOE_CHECK(queue_, "DistributedAdamW::start_reduction: built without overlap_reduction (or with one rank)");
  MOE_CHECK(i >= 0 && i < static_cast<int>(buckets_.size()), "DistributedAdamW::start_reduction: bucket ", i,
            " of ", buckets_.size());
  if (started_[static_cast<size_t>(i)]) return;
  started_[static_cast<size_t>(i)] = true;
  any_started_ = true;
  const Bucket b = buckets_[static_cast<size_t>(i)];
  Communicator* comm = b.group == ReplicaGroup::Dense ? queue_world_.get() : queue_experts_.get();
  queue_->submit([this, b, comm, grads](Stream stream) { reduce_bucket(b, comm, grads, stream); });
}

void DistributedAdamW::finish_reductions() {
  if (!any_started_) return;
  queue_->join();
  std::fill(started_.begin(), started_.end(), false);
  any_started_ = false;
}

// The reverse of the reduce-scatter: each bucket gathers shard elements [k0, k0 + chunk) of every
// rank and writes them back into params (dropping the padding past the region end).
void DistributedAdamW::all_gather_params(const Shard& s, Communicator* comm, const Tensor& params) {
  if (s.shard_numel == 0) return;
  const Tensor staging = arena_.get(staging_), send = arena_.get(send_);
  const int p = s.group_size;
  const int64_t chunk_max = std::min(s.shard_numel, std::max<int64_t>(1, bucket_elems_ / p));
  const int64_t own = s.region_begin + static_cast<int64_t>(s.group_rank) * s.shard_numel;
  for (int64_t k0 = 0; k0 < s.shard_numel; k0 += chunk_max) {
    const int64_t chunk = std::min(chunk_max, s.shard_numel - k0);
    const int64_t own_avail = std::clamp<int64_t>(s.region_end - (own + k0), 0, chunk);
    if (own_avail > 0) copy(flat_range(send, 0, own_avail), flat_range(params, own + k0, own_avail));
    if (own_avail < chunk) fill_zero(flat_range(send, own_avail, chunk - own_avail));
    comm->all_gather(flat_range(staging, 0, chunk * p), flat_range(send, 0, chunk));
    for (int r = 0; r < p; ++r) {
      const int64_t dst = s.region_begin + r * s.shard_numel + k0;
      const int64_t avail = std::clamp<int64_t>(s.region_end - dst, 0, chunk);
      if (avail > 0 && r != s.group_rank) copy(flat_range(params, dst, avail), flat_range(staging, r * chunk, avail));
    }
  }
}

DistributedAdamW::Result DistributedAdamW::step(Tensor params, Tensor grads, const AdamWConfig& cfg, float max_norm,
                                                int64_t step) {
  enqueue_step(params, grads, cfg, max_norm, step);
  return last_result();
}

bool DistributedAdamW::enqueue_step(Tensor params, Tensor grads, const AdamWConfig& cfg, float max_norm, int64_t step,
                                    Tensor schedule, const UpdateOutputs& outputs) {
  MOE_CHECK(params.numel() == reg_.total_numel() && grads.numel() == reg_.total_numel(),
            "DistributedAdamW::step: params has ", params.numel(), " and grads ", grads.numel(),
            " elements, the registry needs ", reg_.total_numel());
  params.check_dtype(DType::F32);
  grads.check_dtype(DType::F32);
  for (const CopyTarget& t : outputs.bf16) {  // checked on every rank, written by one
    t.copy.check_dtype(DType::BF16);
    MOE_CHECK(t.copy.numel() == t.master.numel(), "DistributedAdamW: a BF16 copy of ", t.copy.numel(),
              " elements for a master tensor of ", t.master.numel());
  }
  const bool write_outputs = single_rank_ && (!outputs.bf16.empty() || !outputs.fp8.empty());
  const std::vector<PieceOutput> piece_outputs =
      write_outputs ? map_outputs(params, outputs) : std::vector<PieceOutput>();

  // 1. Gradient reduction over each replica group into this rank's shards (one rank: the
  // gradient buffer already is the whole shard, in the same order).
  // With overlap: the buckets the backward has not started yet, then the wait for all of them.
  if (!single_rank_) {
    const auto t0 = std::chrono::steady_clock::now();
    if (queue_) {
      for (int i = 0; i < static_cast<int>(buckets_.size()); ++i) start_reduction(i, grads);
      finish_reductions();
    } else {
      for (const Bucket& b : buckets_)
        reduce_bucket(b, b.group == ReplicaGroup::Dense ? mesh_.world : mesh_.expert_replicas.get(), grads, {});
    }
    reduction_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // 2. Global squared norm. Every element of every logical parameter is counted exactly once:
  // the dense shards partition the dense region over the world (each rank one disjoint piece);
  // the expert shards partition each EP slice over its replica group (ranks with the same
  // ep_index), and ranks of different ep_index hold different EP slices, i.e. different
  // parameters; pipeline stages hold different layers. The padding is zero. So the sum of the shard
  // norms over all stages is the full norm. The
  // shard buffer is [dense | expert] in one piece, so one pass covers both (with one rank it is
  // exactly AdamW's pass over the whole gradient buffer).
  const Tensor norm_sq = arena_.get(norm_sq_), grad_shard = single_rank_ ? grads : arena_.get(grad_shard_);
  fill_zero(norm_sq);
  sum_squares_accumulate(norm_sq, grad_shard, arena_.get(norm_ws_));
  mesh_.all_stages().all_reduce(norm_sq, ReduceOp::Sum);  // with pipeline stages, over all of them

  // 3. AdamW on the shard, one call per parameter piece so each gets its own weight decay.
  // Clipping and the non-finite skip read the all-reduced norm in memory: every rank sees the
  // same value, so a non-finite gradient anywhere skips the step everywhere.
  const Tensor m = arena_.get(m_), v = arena_.get(v_);
  AdamWConfig no_decay = cfg;
  no_decay.weight_decay = 0.0f;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& pc = pieces_[i];
    const int64_t grad_at = single_rank_ ? pc.flat_begin : pc.buffer_offset;
    const AdamWConfig& piece_cfg = reg_.entry(pc.param).decay ? cfg : no_decay;
    const PieceOutput out = write_outputs ? piece_outputs[i] : PieceOutput{};
    if (out.fp8 != nullptr) {
      // One call per quantized matrix, made at its first piece (a fused gate/up matrix spans two
      // parameters); one rank: the moments sit at the same flat offsets as the params.
      if (!out.first_of_fp8) continue;
      const Tensor& w = out.fp8->master;
      MOE_CHECK(flat_offset(params, w) == pc.flat_begin,
                "DistributedAdamW: an FP8-cached matrix starts before its first parameter");
      auto like_w = [&](const Tensor& buffer, int64_t at) { return flat_range(buffer, at, w.numel()).view(w.shape); };
      adamw_step_quantize_blocks(w, like_w(grad_shard, grad_at), like_w(m, pc.buffer_offset),
                                 like_w(v, pc.buffer_offset), norm_sq, max_norm, piece_cfg, step, out.fp8->w,
                                 out.fp8->w_t, {}, schedule);
      continue;
    }
    adamw_step(flat_range(params, pc.flat_begin, pc.n), flat_range(grad_shard, grad_at, pc.n),
               flat_range(m, pc.buffer_offset, pc.n), flat_range(v, pc.buffer_offset, pc.n), norm_sq, max_norm,
               piece_cfg, step, {}, schedule, out.copy);
  }

  // 4. Every replica gets the updated shards back.
  if (!single_rank_) {
    all_gather_params(dense_, mesh_.world, params);
    all_gather_params(expert_, mesh_.expert_replicas.get(), params);
  }
  return write_outputs;
}

DistributedAdamW::Result DistributedAdamW::last_result() const {
  return read_adamw_outcome(arena_.get(norm_sq_));
}

std::vector<DistributedAdamW::MomentSlice> DistributedAdamW::moment_slices() const {
  const Tensor m = arena_.get(m_), v = arena_.get(v_);
  std::vector<MomentSlice> out;
  out.reserve(pieces_.size());
  for (const Piece& pc : pieces_) {
    const ParamEntry& e = reg_.entry(pc.param);
    MomentSlice s;
    s.param = pc.param;
    s.entry = &e;
    s.begin = e.global_begin() + (pc.flat_begin - e.offset);
    s.end = s.begin + pc.n;
    s.exp_avg = flat_range(m, pc.buffer_offset, pc.n);
    s.exp_avg_sq = flat_range(v, pc.buffer_offset, pc.n);
    out.push_back(s);
  }
  return out;
}

void DistributedAdamW::load_moments(const ReadFn& read_fn) const {
  for (const MomentSlice& s : moment_slices()) {
    read_fn(s.entry->name + ".exp_avg", s.begin, s.end, s.exp_avg);
    read_fn(s.entry->name + ".exp_avg_sq", s.begin, s.end, s.exp_avg_sq);
  }
}

}  // namespace moe

// ranks: 2 4
// DistributedAdamW (ZeRO-1 over replica groups) against an unsharded torch-style AdamW applied
// to the summed gradient of each parameter's replica group, on meshes with ep 1, 2 and 4, and
// (with FP32 or BF16 moments) against one rank given those summed gradients, bit for bit.
// The registry has dense parameters of odd sizes (the dense region, 57 elements, is padded at
// 2 and 4 ranks) and expert parameters sliced by EP (the expert region is padded where
// ep_dp does not divide it).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "moe/comm/local_communicator.h"
#include "moe/comm/mesh.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/core/arena.h"
#include "moe/core/rng.h"
#include "moe/model/params.h"
#include "moe/optim/adamw.h"
#include "moe/optim/distributed_adamw.h"
#include "moe/ops/fp8.h"

namespace moe {
namespace {

struct Spec {
  std::string name;
  std::vector<int64_t> shape;  // logical
  bool expert;
  bool decay;
};

std::vector<Spec> specs(int64_t experts) {
  return {{"model.embed_tokens.weight", {7, 5}, false, true},
          {"model.norm.weight", {13}, false, false},
          {"model.layers.0.self_attn.q_proj.weight", {3, 3}, false, true},
          {"model.layers.0.mlp.experts.gate_up_proj", {experts, 3, 3}, true, true},
          {"model.layers.0.mlp.experts.down_proj", {experts, 2, 3}, true, false}};
}

Shape to_shape(const std::vector<int64_t>& d) {
  Shape s;
  for (int64_t v : d) s.dims[s.ndim++] = v;
  return s;
}

int64_t numel(const std::vector<int64_t>& d) {
  int64_t n = 1;
  for (int64_t v : d) n *= v;
  return n;
}

// Deterministic values keyed by (what, param, logical element, step): magnitude in [lo, hi], random sign.
float keyed_value(uint64_t what, int param, int64_t logical, int64_t step, double lo, double hi) {
  Rng rng(hash_counters(what, static_cast<uint64_t>(param), static_cast<uint64_t>(logical), static_cast<uint64_t>(step)));
  const double mag = lo + (hi - lo) * rng.uniform();
  return static_cast<float>(rng.uniform() < 0.5 ? -mag : mag);
}
float init_value(int param, int64_t logical) { return keyed_value(1, param, logical, 0, 0.1, 1.0); }
// Rank r's local gradient: the same sign on every rank, so replica sums stay away from zero.
float grad_value(int rank, int param, int64_t logical, int64_t step) {
  return keyed_value(2, param, logical, step, 0.5, 1.0) * (1.0f + 0.25f * static_cast<float>(rank));
}
// A gradient of few significant bits: +-k/16 (k = 1..8) times 1 or 2 (by rank parity). Every sum a
// reduction forms from these (over up to 4 ranks in any order or bucketing, and the squared norms,
// multiples of 1/256 below 2^16, in any partition) is exact in FP32, so a sharded run sees the very
// numbers a single rank given the summed gradient sees, and their results can be compared bit for bit.
float exact_grad_value(int rank, int param, int64_t logical, int64_t step) {
  Rng rng(hash_counters(3, static_cast<uint64_t>(param), static_cast<uint64_t>(logical), static_cast<uint64_t>(step)));
  const float k = static_cast<float>(1 + static_cast<int>(rng.uniform() * 8.0));
  return (rng.uniform() < 0.5 ? -k : k) / 16.0f * static_cast<float>(1 + rank % 2);
}
using GradFn = float (*)(int rank, int param, int64_t logical, int64_t step);

// One rank's optimizer setup for a mesh with `ep`.
struct Case {
  int64_t experts = 0;
  Mesh mesh;
  ParamRegistry reg;
  Arena arena{"distributed_optimizer_test"};
  Arena::Slot params_slot, grads_slot;
  std::unique_ptr<DistributedAdamW> opt;

  Tensor params() const { return arena.get(params_slot); }
  Tensor grads() const { return arena.get(grads_slot); }

  void fill_grads(int64_t step, GradFn value = grad_value) {
    Tensor g = grads();
    for (int i = 0; i < static_cast<int>(reg.entries().size()); ++i) {
      const ParamEntry& e = reg.entry(i);
      float* gv = reg.view(g, i).f32();
      for (int64_t j = 0; j < e.numel(); ++j) gv[j] = value(mesh.rank, i, e.global_begin() + j, step);
    }
  }
};

int64_t experts_for(int ep) { return ep == 4 ? 4 : 6; }

// experts: 0 = experts_for(ep).
std::unique_ptr<Case> make_case(Communicator& world, int ep, size_t bucket_bytes,
                                DType moment_dtype = DType::F32, int64_t experts = 0) {
  auto c = std::make_unique<Case>();
  c->experts = experts > 0 ? experts : experts_for(ep);
  c->mesh = make_mesh(world, ep, c->experts);
  const int64_t per_rank = c->experts / ep;
  for (const Spec& s : specs(c->experts)) {
    if (s.expert)
      c->reg.add_sliced(s.name, to_shape(s.shape), c->mesh.ep_index * per_rank, per_rank, ReplicaGroup::Expert, s.decay);
    else
      c->reg.add(s.name, to_shape(s.shape), ReplicaGroup::Dense, s.decay);
  }
  c->params_slot = c->arena.reserve("params", DType::F32, {c->reg.total_numel()});
  c->grads_slot = c->arena.reserve("grads", DType::F32, {c->reg.total_numel()});
  c->opt = std::make_unique<DistributedAdamW>(c->reg, c->mesh, c->arena, moment_dtype, bucket_bytes);
  c->arena.commit();
  Tensor p = c->params();
  for (int i = 0; i < static_cast<int>(c->reg.entries().size()); ++i) {
    const ParamEntry& e = c->reg.entry(i);
    float* pv = c->reg.view(p, i).f32();
    for (int64_t j = 0; j < e.numel(); ++j) pv[j] = init_value(i, e.global_begin() + j);
  }
  return c;
}

// The unsharded reference: every logical tensor whole, in double, updated with the gradient
// summed over each parameter's replica group (torch.optim.AdamW + clip_grad_norm_).
struct Reference {
  int world_size = 1, ep = 1;
  int64_t experts = 0;
  std::vector<Spec> spec;
  std::vector<std::vector<double>> p, m, v;

  Reference(int world_size_, int ep_, int64_t experts_)
      : world_size(world_size_), ep(ep_), experts(experts_), spec(specs(experts_)) {
    for (int i = 0; i < static_cast<int>(spec.size()); ++i) {
      const int64_t n = numel(spec[i].shape);
      p.emplace_back(n);
      m.emplace_back(n, 0.0);
      v.emplace_back(n, 0.0);
      for (int64_t l = 0; l < n; ++l) p[i][l] = init_value(i, l);
    }
  }

  // Gradient of logical element l of parameter i: the sum over the ranks holding a replica.
  double summed_grad(int i, int64_t l, int64_t step, GradFn value = grad_value) const {
    double g = 0;
    if (!spec[i].expert) {
      for (int r = 0; r < world_size; ++r) g += value(r, i, l, step);
      return g;
    }
    const int64_t row = l / (numel(spec[i].shape) / spec[i].shape[0]);
    const int ep_index = static_cast<int>(row / (experts / ep));
    for (int d = 0; d < world_size / ep; ++d) g += value(d * ep + ep_index, i, l, step);
    return g;
  }

  double step(const AdamWConfig& c, double max_norm, int64_t step) {
    std::vector<std::vector<double>> grads(spec.size());
    double norm_sq = 0;
    for (int i = 0; i < static_cast<int>(spec.size()); ++i) {
      for (int64_t l = 0; l < static_cast<int64_t>(p[i].size()); ++l) {
        grads[i].push_back(summed_grad(i, l, step));
        norm_sq += grads[i].back() * grads[i].back();
      }
    }
    const double clip = max_norm > 0 ? std::min(1.0, max_norm / (std::sqrt(norm_sq) + 1e-6)) : 1.0;
    const double bc1 = 1 - std::pow(double(c.beta1), step), bc2 = 1 - std::pow(double(c.beta2), step);
    for (int i = 0; i < static_cast<int>(spec.size()); ++i) {
      const double wd = spec[i].decay ? c.weight_decay : 0.0;
      for (size_t l = 0; l < p[i].size(); ++l) {
        const double g = clip * grads[i][l];
        p[i][l] *= 1 - double(c.lr) * wd;
        m[i][l] = c.beta1 * m[i][l] + (1 - double(c.beta1)) * g;
        v[i][l] = c.beta2 * v[i][l] + (1 - double(c.beta2)) * g * g;
        p[i][l] -= c.lr * (m[i][l] / bc1) / (std::sqrt(v[i][l] / bc2) + c.eps);
      }
    }
    return std::sqrt(norm_sq);
  }
};

AdamWConfig test_config() {
  AdamWConfig c;
  c.lr = 1e-2f;
  c.weight_decay = 0.1f;
  return c;
}
constexpr float kMaxNorm = 1.0f;  // the summed gradients' norm is far above it: clipping is active

double rel_err(double got, double want) { return std::fabs(got - want) / std::max(std::fabs(want), 1e-3); }

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
std::vector<int> ep_sizes() {
  std::vector<int> eps;
  for (int ep : {1, 2, 4})
    if (world_size() % ep == 0) eps.push_back(ep);
  return eps;
}

// Every rank's params buffer (all the same size) gathered everywhere.
std::vector<float> gather_params(const Case& c) {
  const int64_t n = c.reg.total_numel();
  std::vector<float> all(static_cast<size_t>(n) * world_size());
  MPI_Allgather(c.params().data, static_cast<int>(n), MPI_FLOAT, all.data(), static_cast<int>(n), MPI_FLOAT,
                MPI_COMM_WORLD);
  return all;
}

// Replicas hold identical bits: the dense region on every rank, the expert region on the ranks
// with the same ep_index.
void expect_replicas_identical(const Case& c) {
  const std::vector<float> all = gather_params(c);
  const int64_t n = c.reg.total_numel();
  const float* mine = c.params().f32();
  for (ReplicaGroup g : {ReplicaGroup::Dense, ReplicaGroup::Expert}) {
    const auto [b, e] = c.reg.region(g);
    for (int r = 0; r < world_size(); ++r) {
      if (g == ReplicaGroup::Expert && r % c.mesh.ep != c.mesh.ep_index) continue;
      EXPECT_EQ(std::memcmp(mine + b, all.data() + r * n + b, static_cast<size_t>(e - b) * sizeof(float)), 0)
          << (g == ReplicaGroup::Dense ? "dense" : "expert") << " params differ from rank " << r;
    }
  }
}

// Params and moments of this rank against the reference (moments through moment_slices, i.e. in
// logical coordinates).
void expect_matches_reference(const Case& c, const Reference& ref, const char* what) {
  Tensor p = c.params();
  double worst = 0;
  for (int i = 0; i < static_cast<int>(c.reg.entries().size()); ++i) {
    const ParamEntry& e = c.reg.entry(i);
    const float* pv = c.reg.view(p, i).f32();
    for (int64_t j = 0; j < e.numel(); ++j) worst = std::max(worst, rel_err(pv[j], ref.p[i][e.global_begin() + j]));
  }
  EXPECT_LE(worst, 1e-6) << what << ": params, ep " << c.mesh.ep << ", rank " << c.mesh.rank;
  double worst_m = 0, worst_v = 0;
  for (const auto& s : c.opt->moment_slices()) {
    for (int64_t l = s.begin; l < s.end; ++l) {
      worst_m = std::max(worst_m, std::fabs(s.exp_avg.f32()[l - s.begin] - ref.m[s.param][l]) /
                                      std::max(std::fabs(ref.m[s.param][l]), 1e-4));
      worst_v = std::max(worst_v, std::fabs(s.exp_avg_sq.f32()[l - s.begin] - ref.v[s.param][l]) /
                                      std::max(std::fabs(ref.v[s.param][l]), 1e-8));
    }
  }
  EXPECT_LE(worst_m, 1e-5) << what << ": exp_avg, ep " << c.mesh.ep << ", rank " << c.mesh.rank;
  EXPECT_LE(worst_v, 1e-5) << what << ": exp_avg_sq, ep " << c.mesh.ep << ", rank " << c.mesh.rank;
}

TEST(DistributedOptimizer, three_steps_match_unsharded_adamw_on_summed_gradients) {
  MpiCommunicator world(MPI_COMM_WORLD);
  for (int ep : ep_sizes()) {
    SCOPED_TRACE("ep " + std::to_string(ep));
    auto c = make_case(world, ep, DistributedAdamW::kDefaultBucketBytes);
    Reference ref(world_size(), ep, c->experts);
    for (int64_t step = 1; step <= 3; ++step) {
      c->fill_grads(step);
      const auto r = c->opt->step(c->params(), c->grads(), test_config(), kMaxNorm, step);
      const double want_norm = ref.step(test_config(), kMaxNorm, step);
      EXPECT_FALSE(r.skipped);
      EXPECT_LE(rel_err(r.grad_norm, want_norm), 1e-6) << "step " << step << ": " << r.grad_norm << " vs " << want_norm;
    }
    expect_matches_reference(*c, ref, "after 3 steps");
    expect_replicas_identical(*c);
  }
}

TEST(DistributedOptimizer, buckets_smaller_than_a_parameter_give_the_same_result) {
  MpiCommunicator world(MPI_COMM_WORLD);
  for (int ep : ep_sizes()) {
    SCOPED_TRACE("ep " + std::to_string(ep));
    auto small = make_case(world, ep, 64);
    auto large = make_case(world, ep, DistributedAdamW::kDefaultBucketBytes);
    Reference ref(world_size(), ep, small->experts);
    for (int64_t step = 1; step <= 3; ++step) {
      small->fill_grads(step);
      large->fill_grads(step);
      const auto rs = small->opt->step(small->params(), small->grads(), test_config(), kMaxNorm, step);
      const auto rl = large->opt->step(large->params(), large->grads(), test_config(), kMaxNorm, step);
      ref.step(test_config(), kMaxNorm, step);
      EXPECT_LE(rel_err(rs.grad_norm, rl.grad_norm), 1e-6);
    }
    const float* ps = small->params().f32();
    const float* pl = large->params().f32();
    double worst = 0;
    for (int64_t k = 0; k < small->reg.total_numel(); ++k) worst = std::max(worst, rel_err(ps[k], pl[k]));
    EXPECT_LE(worst, 1e-6) << "rank " << world_rank();
    expect_matches_reference(*small, ref, "64-byte buckets");
    expect_replicas_identical(*small);
  }
}

// A NaN in one rank's gradient (dense or expert) skips the step everywhere: params and moments
// keep every bit, and the next finite step proceeds.
void expect_a_nan_on_the_last_rank_skips_the_step(MpiCommunicator& world, int ep, bool in_expert, DType moments) {
  SCOPED_TRACE("ep " + std::to_string(ep) + (in_expert ? ", NaN in an expert gradient" : ", NaN in a dense gradient") +
               ", moments " + std::string(dtype_name(moments)));
  auto c = make_case(world, ep, 64, moments);
  c->fill_grads(1);
  ASSERT_FALSE(c->opt->step(c->params(), c->grads(), test_config(), kMaxNorm, 1).skipped);

  auto bytes = [](const Tensor& t) {
    return std::vector<char>(static_cast<const char*>(t.data), static_cast<const char*>(t.data) + t.nbytes());
  };
  const std::vector<char> p0 = bytes(c->params()), m0 = bytes(c->opt->exp_avg()), v0 = bytes(c->opt->exp_avg_sq());
  c->fill_grads(2);
  if (world_rank() == world_size() - 1) {
    const int64_t at = c->reg.region(in_expert ? ReplicaGroup::Expert : ReplicaGroup::Dense).first + 3;
    c->grads().f32()[at] = std::numeric_limits<float>::quiet_NaN();
  }
  const auto r = c->opt->step(c->params(), c->grads(), test_config(), kMaxNorm, 2);
  EXPECT_TRUE(r.skipped) << "rank " << world_rank();
  EXPECT_FALSE(std::isfinite(r.grad_norm));
  EXPECT_EQ(bytes(c->params()), p0) << "params changed";
  EXPECT_EQ(bytes(c->opt->exp_avg()), m0) << "exp_avg changed";
  EXPECT_EQ(bytes(c->opt->exp_avg_sq()), v0) << "exp_avg_sq changed";
  expect_replicas_identical(*c);

  int skipped = r.skipped ? 1 : 0, all_skipped = 0;
  MPI_Allreduce(&skipped, &all_skipped, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all_skipped, 1);

  c->fill_grads(3);
  EXPECT_FALSE(c->opt->step(c->params(), c->grads(), test_config(), kMaxNorm, 2).skipped);
}

TEST(DistributedOptimizer, a_nan_on_one_rank_skips_the_step_on_all_ranks) {
  MpiCommunicator world(MPI_COMM_WORLD);
  for (int ep : ep_sizes())
    for (bool in_expert : {false, true})
      for (DType moments : {DType::F32, DType::BF16})
        expect_a_nan_on_the_last_rank_skips_the_step(world, ep, in_expert, moments);
}

// Moment slices cover every logical tensor exactly once over all ranks (what a checkpoint
// stores), and load_moments reads back exactly those ranges.
TEST(DistributedOptimizer, moment_slices_partition_every_logical_tensor_and_load_back) {
  MpiCommunicator world(MPI_COMM_WORLD);
  for (int ep : ep_sizes()) {
    SCOPED_TRACE("ep " + std::to_string(ep));
    auto c = make_case(world, ep, 64);
    const auto spec = specs(c->experts);
    const auto slices = c->opt->moment_slices();
    for (int i = 0; i < static_cast<int>(spec.size()); ++i) {
      std::vector<int> covered(static_cast<size_t>(numel(spec[i].shape)), 0);
      for (const auto& s : slices) {
        if (s.param != i) continue;
        EXPECT_EQ(s.entry->name, spec[i].name);
        for (int64_t l = s.begin; l < s.end; ++l) covered[l] += 1;
      }
      MPI_Allreduce(MPI_IN_PLACE, covered.data(), static_cast<int>(covered.size()), MPI_INT, MPI_SUM, MPI_COMM_WORLD);
      for (size_t l = 0; l < covered.size(); ++l)
        ASSERT_EQ(covered[l], 1) << spec[i].name << " element " << l << " is covered " << covered[l] << " times";
    }

    auto stored = [](const std::string& key, int64_t l) {
      return static_cast<float>(static_cast<double>(hash_string(key) % 1000) + 1e-3 * static_cast<double>(l));
    };
    c->opt->load_moments([&](const std::string& key, int64_t begin, int64_t end, const Tensor& dst) {
      ASSERT_EQ(dst.numel(), end - begin);
      for (int64_t l = begin; l < end; ++l) dst.f32()[l - begin] = stored(key, l);
    });
    for (const auto& s : c->opt->moment_slices()) {
      for (int64_t l = s.begin; l < s.end; ++l) {
        ASSERT_EQ(s.exp_avg.f32()[l - s.begin], stored(s.entry->name + ".exp_avg", l));
        ASSERT_EQ(s.exp_avg_sq.f32()[l - s.begin], stored(s.entry->name + ".exp_avg_sq", l));
      }
    }
  }
}

// With one rank (LocalCommunicator, no MPI) DistributedAdamW is AdamW, bit for bit, including the
// skipped step, with FP32 and with BF16 moments.
void expect_one_rank_equals_adamw(DType moments, size_t bucket) {
  SCOPED_TRACE("moments " + std::string(dtype_name(moments)) + ", bucket " + std::to_string(bucket));
  LocalCommunicator local;
  auto c = make_case(local, 1, bucket, moments);
  ParamRegistry& reg = c->reg;
  Arena arena("single_rank_adamw");
  const auto p_slot = arena.reserve("params", DType::F32, {reg.total_numel()});
  AdamW single(reg, arena, moments);
  arena.commit();
  Tensor p = arena.get(p_slot);
  std::memcpy(p.data, c->params().data, p.nbytes());
  for (int64_t step = 1; step <= 4; ++step) {
    c->fill_grads(step);
    if (step == 3) c->grads().f32()[reg.total_numel() - 2] = std::numeric_limits<float>::infinity();
    const auto rd = c->opt->step(c->params(), c->grads(), test_config(), kMaxNorm, step);
    const auto rs = single.step(p, c->grads(), test_config(), kMaxNorm, step);
    EXPECT_EQ(rd.skipped, step == 3);
    EXPECT_EQ(rd.skipped, rs.skipped);
    if (!rs.skipped) {
      EXPECT_EQ(rd.grad_norm, rs.grad_norm) << "step " << step;
    }
    ASSERT_EQ(std::memcmp(c->params().data, p.data, p.nbytes()), 0) << "params differ after step " << step;
    ASSERT_EQ(c->opt->exp_avg().dtype, moments);
    ASSERT_EQ(single.exp_avg().dtype, moments);
    ASSERT_EQ(c->opt->exp_avg().numel(), single.exp_avg().numel());
    ASSERT_EQ(std::memcmp(c->opt->exp_avg().data, single.exp_avg().data, single.exp_avg().nbytes()), 0);
    ASSERT_EQ(std::memcmp(c->opt->exp_avg_sq().data, single.exp_avg_sq().data, single.exp_avg_sq().nbytes()), 0);
  }
}

TEST(DistributedOptimizer, one_rank_equals_single_rank_adamw_bit_for_bit) {
  for (DType moments : {DType::F32, DType::BF16})
    for (size_t bucket : {size_t{64}, DistributedAdamW::kDefaultBucketBytes})
      expect_one_rank_equals_adamw(moments, bucket);
}

// ZeRO-1 over 2 and 4 ranks (ep 1, 2, 4; small and large buckets) equals one rank holding every
// parameter and given the gradient summed over each replica group, bit for bit, with BF16 moments
// and with FP32 ones: params, exp_avg and exp_avg_sq in logical coordinates after four steps with
// weight decay and clipping active (exact_grad_value makes every reduction exact). The shard
// moment buffers take 2 (BF16) or 4 (FP32) bytes per shard element.
TEST(DistributedOptimizer, sharded_moments_equal_the_single_rank_run_bit_for_bit) {
  MpiCommunicator world(MPI_COMM_WORLD);
  LocalCommunicator local;
  for (DType moments : {DType::BF16, DType::F32}) {
    for (int ep : ep_sizes()) {
      for (size_t bucket : {size_t{64}, DistributedAdamW::kDefaultBucketBytes}) {
        SCOPED_TRACE("moments " + std::string(dtype_name(moments)) + ", ep " + std::to_string(ep) + ", bucket " +
                     std::to_string(bucket));
        auto sharded = make_case(world, ep, bucket, moments);
        auto single = make_case(local, 1, bucket, moments, sharded->experts);
        const auto& dense = sharded->opt->shard(ReplicaGroup::Dense);
        const auto& expert = sharded->opt->shard(ReplicaGroup::Expert);
        EXPECT_EQ(sharded->opt->exp_avg().nbytes(),
                  static_cast<size_t>(dense.shard_numel + expert.shard_numel) * dtype_size(moments));
        const Reference sums(world_size(), ep, sharded->experts);  // only its summed_grad is used
        for (int64_t step = 1; step <= 4; ++step) {
          sharded->fill_grads(step, exact_grad_value);
          Tensor g = single->grads();
          for (int i = 0; i < static_cast<int>(single->reg.entries().size()); ++i) {
            float* gv = single->reg.view(g, i).f32();
            for (int64_t l = 0; l < single->reg.entry(i).numel(); ++l)
              gv[l] = static_cast<float>(sums.summed_grad(i, l, step, exact_grad_value));
          }
          const auto rs = sharded->opt->step(sharded->params(), sharded->grads(), test_config(), kMaxNorm, step);
          const auto r1 = single->opt->step(single->params(), single->grads(), test_config(), kMaxNorm, step);
          ASSERT_EQ(rs.grad_norm, r1.grad_norm) << "step " << step;
          ASSERT_GT(rs.grad_norm, 2 * kMaxNorm) << "clipping is meant to be active";
        }
        // This rank's params and moment slices against the same logical elements of the single run.
        auto same = [](const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; };
        const Tensor p = sharded->params(), p1 = single->params();
        for (int i = 0; i < static_cast<int>(sharded->reg.entries().size()); ++i) {
          const ParamEntry& e = sharded->reg.entry(i);
          EXPECT_TRUE(same(sharded->reg.view(p, i).f32(), single->reg.view(p1, i).f32() + e.global_begin(),
                           static_cast<size_t>(e.numel()) * sizeof(float)))
              << e.name << ": params differ, rank " << world_rank();
        }
        const auto whole = single->opt->moment_slices();
        for (const auto& s : sharded->opt->moment_slices()) {
          const auto& w = whole[static_cast<size_t>(s.param)];
          ASSERT_EQ(w.entry->name, s.entry->name);
          ASSERT_EQ(w.begin, 0);
          const size_t at = static_cast<size_t>(s.begin) * dtype_size(moments), bytes = s.exp_avg.nbytes();
          EXPECT_TRUE(same(s.exp_avg.data, static_cast<const char*>(w.exp_avg.data) + at, bytes))
              << s.entry->name << ": exp_avg differs, rank " << world_rank();
          EXPECT_TRUE(same(s.exp_avg_sq.data, static_cast<const char*>(w.exp_avg_sq.data) + at, bytes))
              << s.entry->name << ": exp_avg_sq differs, rank " << world_rank();
        }
      }
    }
  }
}

// compute_copy: one rank writes the BF16 copy of the updated params in the update's own pass (every
// element the rounding of the new param) and says so; several ranks leave it to the caller
// (the gathered params arrive after the update) and do not touch it.
TEST(DistributedOptimizer, the_bf16_compute_copy_is_written_by_one_rank_only) {
  LocalCommunicator local;
  MpiCommunicator world(MPI_COMM_WORLD);
  for (Communicator* comm : {static_cast<Communicator*>(&local), static_cast<Communicator*>(&world)}) {
    auto c = make_case(*comm, 1, DistributedAdamW::kDefaultBucketBytes);
    const int64_t n = c->reg.total_numel();
    std::vector<uint16_t> copy(static_cast<size_t>(n), 0x7fc1);  // a NaN no rounding produces
    const Tensor copy_t(copy.data(), DType::BF16, {n});
    for (int64_t step = 1; step <= 2; ++step) {
      c->fill_grads(step);
      const bool wrote = c->opt->enqueue_step(c->params(), c->grads(), test_config(), kMaxNorm, step, {},
                                              {.bf16 = {{c->params(), copy_t}}, .fp8 = {}});
      EXPECT_EQ(wrote, comm->size() == 1) << "ranks " << comm->size();
    }
    const float* p = c->params().f32();
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = comm->size() == 1 ? f32_to_bf16(p[i]) : uint16_t{0x7fc1};
      ASSERT_EQ(copy[static_cast<size_t>(i)], want) << "element " << i << ", ranks " << comm->size();
    }
    std::vector<uint16_t> short_copy(static_cast<size_t>(n - 1));
    EXPECT_THROW(c->opt->enqueue_step(c->params(), c->grads(), test_config(), kMaxNorm, 3, {},
                                      {.bf16 = {{c->params(), Tensor(short_copy.data(), DType::BF16, {n - 1})}},
                                       .fp8 = {}}),
                 Error);
  }
}

// An FP8 weight cache in host memory (codes and Blocks scales of `shape`, both orientations).
struct HostCache {
  std::vector<uint8_t> codes, codes_t;
  std::vector<float> scales, scales_t;
  Fp8Tensor w, w_t;
  explicit HostCache(Shape shape) {
    Shape t = shape;
    std::swap(t.dims[t.ndim - 1], t.dims[t.ndim - 2]);
    codes.assign(static_cast<size_t>(shape.numel()), 0xa5);
    codes_t.assign(codes.size(), 0xa5);
    scales.assign(static_cast<size_t>(fp8_scale_shape(shape, Fp8Tiles::Blocks).numel()), -1.0f);
    scales_t.assign(scales.size(), -1.0f);
    w = {Tensor(codes.data(), DType::FP8_E4M3, shape), f32_tensor(scales.data(), fp8_scale_shape(shape, Fp8Tiles::Blocks)),
         Fp8Tiles::Blocks};
    w_t = {Tensor(codes_t.data(), DType::FP8_E4M3, t), f32_tensor(scales_t.data(), fp8_scale_shape(t, Fp8Tiles::Blocks)),
           Fp8Tiles::Blocks};
  }
};

// Update outputs with one rank: the FP8 caches of the quantized matrices (q_proj, the experts'
// gate_up) and the BF16 copies of other tensors (embedding, norm), written in the update's own pass,
// equal the plain update followed by fp8_quantize_blocks and the BF16 rounding of the new weights,
// bit for bit, and the tensors without an output (down_proj) are updated the same. A target that
// splits a parameter, or a matrix mixing weight decay settings, is refused.
TEST(DistributedOptimizer, update_outputs_equal_a_refresh_after_the_update) {
  LocalCommunicator local;
  auto fused = make_case(local, 1, DistributedAdamW::kDefaultBucketBytes);
  auto plain = make_case(local, 1, DistributedAdamW::kDefaultBucketBytes);
  auto view = [](const Case& c, const char* name) { return c.reg.view(c.params(), c.reg.index(name)); };
  const char* q = "model.layers.0.self_attn.q_proj.weight";
  const char* gate_up = "model.layers.0.mlp.experts.gate_up_proj";
  const char* embed = "model.embed_tokens.weight";
  const char* norm = "model.norm.weight";
  HostCache q_cache(view(*fused, q).shape), gu_cache(view(*fused, gate_up).shape);
  HostCache q_want(view(*fused, q).shape), gu_want(view(*fused, gate_up).shape);
  std::vector<uint16_t> embed_copy(static_cast<size_t>(view(*fused, embed).numel())),
      norm_copy(static_cast<size_t>(view(*fused, norm).numel()));
  DistributedAdamW::UpdateOutputs outputs;
  outputs.fp8 = {{view(*fused, q), q_cache.w, q_cache.w_t}, {view(*fused, gate_up), gu_cache.w, gu_cache.w_t}};
  outputs.bf16 = {{view(*fused, embed), Tensor(embed_copy.data(), DType::BF16, view(*fused, embed).shape)},
                  {view(*fused, norm), Tensor(norm_copy.data(), DType::BF16, view(*fused, norm).shape)}};
  for (int64_t step = 1; step <= 3; ++step) {
    fused->fill_grads(step);
    plain->fill_grads(step);
    EXPECT_TRUE(fused->opt->enqueue_step(fused->params(), fused->grads(), test_config(), kMaxNorm, step, {}, outputs));
    plain->opt->enqueue_step(plain->params(), plain->grads(), test_config(), kMaxNorm, step);
  }
  const int64_t n = fused->reg.total_numel();
  ASSERT_EQ(std::memcmp(fused->params().data, plain->params().data, static_cast<size_t>(n) * 4), 0)
      << "the weights differ from the plain update";
  fp8_quantize_blocks(q_want.w, q_want.w_t, view(*plain, q));
  fp8_quantize_blocks(gu_want.w, gu_want.w_t, view(*plain, gate_up));
  for (auto [got, want, what] : {std::tuple{&q_cache, &q_want, "q_proj"}, std::tuple{&gu_cache, &gu_want, "gate_up"}}) {
    EXPECT_EQ(got->codes, want->codes) << what;
    EXPECT_EQ(got->codes_t, want->codes_t) << what;
    EXPECT_EQ(got->scales, want->scales) << what;
    EXPECT_EQ(got->scales_t, want->scales_t) << what;
  }
  for (auto [copy, name] : {std::pair{&embed_copy, embed}, std::pair{&norm_copy, norm}}) {
    const float* p = view(*plain, name).f32();
    for (size_t i = 0; i < copy->size(); ++i) ASSERT_EQ((*copy)[i], f32_to_bf16(p[i])) << name << " element " << i;
  }

  // embed (decay) and norm (no decay) are adjacent: one matrix over both mixes the settings; a
  // matrix over part of embed splits it.
  const Tensor e = view(*fused, embed);
  HostCache mixed({4, 12}), part({2, 5});
  DistributedAdamW::UpdateOutputs bad;
  bad.fp8 = {{Tensor(e.data, DType::F32, {4, 12}), mixed.w, mixed.w_t}};
  EXPECT_THROW(fused->opt->enqueue_step(fused->params(), fused->grads(), test_config(), kMaxNorm, 4, {}, bad), Error);
  bad.fp8 = {{Tensor(e.data, DType::F32, {2, 5}), part.w, part.w_t}};
  EXPECT_THROW(fused->opt->enqueue_step(fused->params(), fused->grads(), test_config(), kMaxNorm, 4, {}, bad), Error);
}

}  // namespace
}  // namespace moe

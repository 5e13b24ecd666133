// Selective activation recompute (train.recompute, model/recompute.h) on one CPU rank: every mode
// gives the gradients of no recompute bit for bit, for configs that reach every recomputed path
// (learned routing with drops, a shared expert and a dense first layer, GQA, per-head and no
// qk-norm, random routing whose choice must be replayed, the balancing bias), the same losses
// over several optimizer steps, and an activation plan smaller by exactly the buffers it drops;
// experts and attention compute again every layer but the top one of each microbatch.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "../train/train_test_util.h"
#include "../train/trainer_test_util.h"
#include "recompute_plan.h"
#include "moe/core/arena.h"
#include "moe/model/transformer.h"
#include "moe/parallel/local_dispatcher.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

using testing::Gradients;
using testing::local_world;
using testing::quiet_bench;
using testing::step_gradients;
using testing::small_config;
using testing::TempDir;
using testing::expect_plan_shrinks_exactly;

const std::vector<Recompute> kRecomputeModes = {Recompute::Experts, Recompute::Attention, Recompute::Block};

std::string recompute_key(Recompute r) { return std::string("train.recompute=\"") + to_string(r) + "\""; }

struct Case {
  std::string name;
  std::vector<std::string> overrides;
};

// Each on top of small_config (2 layers of 8 experts top-2, 2 microbatches per step).
const std::vector<Case> kCases = {
    {"learned_routing_with_drops", {"model.capacity_factor=0.5"}},
    {"shared_expert_and_dense_first_layer",
     {"model.num_hidden_layers=3", "model.first_k_dense_replace=1", "model.dense_intermediate_size=48",
      "model.shared_expert_intermediate_size=24", "model.capacity_factor=0.75"}},
    {"grouped_query_attention", {"model.num_key_value_heads=2", "model.dropless=true"}},
    {"per_head_qk_norm", {"model.qk_norm=\"per_head\"", "model.norm_topk_prob=true"}},
    {"no_qk_norm_sigmoid_router", {"model.qk_norm=\"none\"", "model.router_score=\"sigmoid\""}},
    {"random_routing", {"model.routing=\"random\"", "model.capacity_factor=0.75"}},
    {"fsdp_baseline", {"parallel.mode=\"fsdp\"", "model.capacity_factor=0.75"}},  // weights gathered per block
};

Config case_config(const std::string& dir, const Case& c, Recompute r, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = c.overrides;
  o.push_back(recompute_key(r));
  o.insert(o.end(), extra.begin(), extra.end());
  return small_config(dir, o);
}

// Bit for bit, element by element (the first difference is named).
void expect_bit_equal(const Gradients& want, const Gradients& got, const std::string& label) {
  ASSERT_EQ(want.size(), got.size()) << label;
  for (const auto& [name, g] : want) {
    ASSERT_TRUE(got.count(name)) << label << ": no gradient of " << name;
    const std::vector<float>& h = got.at(name);
    ASSERT_EQ(g.size(), h.size()) << label << ": " << name;
    if (std::memcmp(g.data(), h.data(), g.size() * sizeof(float)) == 0) continue;
    for (size_t i = 0; i < g.size(); ++i)
      if (std::memcmp(&g[i], &h[i], sizeof(float)) != 0) {
        ADD_FAILURE() << label << ": gradient of " << name << "[" << i << "] is " << h[i] << ", without recompute "
                      << g[i];
        break;
      }
  }
}

class RecomputeCase : public ::testing::TestWithParam<Case> {};

TEST_P(RecomputeCase, EveryModeGivesTheGradientsOfNoRecomputeBitForBit) {
  const Case& c = GetParam();
  TempDir dir;
  Trainer none(case_config(dir.path, c, Recompute::None), quiet_bench(), local_world());
  ASSERT_EQ(none.model().recompute(), Recompute::None);
  const Gradients want = step_gradients(none, 0);
  double nonzero = 0;
  for (const auto& [name, g] : want)
    for (float v : g) nonzero += v != 0.0f;
  ASSERT_GT(nonzero, 0) << "the reference gradient is all zero";
  for (Recompute r : kRecomputeModes) {
    const Config cfg = case_config(dir.path, c, r);
    Trainer t(cfg, quiet_bench(), local_world());
    ASSERT_EQ(t.model().recompute(), r);
    expect_bit_equal(want, step_gradients(t, 0), c.name + ", recompute = " + to_string(r));
    // Per microbatch: block recomputes every layer; experts and attention every layer that drops
    // activations but the last one forward ran, whose backward follows at once (model/recompute.h).
    const ModelConfig& m = cfg.model;
    const int64_t moe_layers = m.num_hidden_layers - m.first_k_dense_replace;
    const int64_t per_microbatch = r == Recompute::Block     ? m.num_hidden_layers
                                   : r == Recompute::Experts ? moe_layers - 1
                                                             : m.num_hidden_layers - 1;
    EXPECT_EQ(t.model().recomputed_layers(), per_microbatch * cfg.accumulation_steps(1))
        << c.name << ", recompute = " << to_string(r);
  }
}

// Several optimizer steps (the weights, the balancing bias and the lease reuse across microbatches
// and steps all in play) with a forward-only evaluation after every second step: every step's
// loss, gradient norm, drop fraction and dispatch bytes equal, and every evaluation loss.
struct Curve {
  std::vector<StepRecord> steps;
  std::vector<double> evals;
};

Curve loss_curve(const Config& cfg) {
  Trainer t(cfg, quiet_bench(), local_world());
  Curve c;
  for (int64_t step = 0; step < 4; ++step) {
    c.steps.push_back(t.train_step(step));
    if (step % 2 == 1) c.evals.push_back(t.evaluate(2).value_or(-1.0));
  }
  return c;
}

TEST_P(RecomputeCase, LossCurvesAreIdenticalOverSeveralSteps) {
  const Case& c = GetParam();
  TempDir dir;
  const std::vector<std::string> bias = {"model.bias_update_rate=0.01"};
  const Curve want = loss_curve(case_config(dir.path, c, Recompute::None, bias));
  ASSERT_EQ(want.evals.size(), 2u);
  EXPECT_GT(want.evals[0], 0.0) << "no held-out microbatch was evaluated";
  EXPECT_LT(want.steps.back().loss, want.steps.front().loss) << "the reference run does not learn";
  for (Recompute r : kRecomputeModes) {
    const Curve got = loss_curve(case_config(dir.path, c, r, bias));
    ASSERT_EQ(got.steps.size(), want.steps.size());
    for (size_t i = 0; i < want.steps.size(); ++i) {
      SCOPED_TRACE(c.name + ", recompute = " + to_string(r) + ", step " + std::to_string(i + 1));
      EXPECT_EQ(got.steps[i].loss, want.steps[i].loss);
      EXPECT_EQ(got.steps[i].grad_norm, want.steps[i].grad_norm);
      EXPECT_EQ(got.steps[i].dropped_fraction, want.steps[i].dropped_fraction);
      EXPECT_EQ(got.steps[i].dispatch_bytes, want.steps[i].dispatch_bytes);  // re-dispatch is not counted
    }
    EXPECT_EQ(got.evals, want.evals) << c.name << ", recompute = " << to_string(r);
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, RecomputeCase, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The drops case does drop routes (so the replayed plan has -1 entries and a clamped expert).
TEST(Recompute, TheDropsCaseDropsRoutes) {
  TempDir dir;
  Trainer t(case_config(dir.path, kCases[0], Recompute::Block, {"train.steps=1"}), quiet_bench(), local_world());
  const TrainSummary s = t.run();
  ASSERT_EQ(s.steps.size(), 1u);
  EXPECT_GT(s.steps[0].dropped_fraction, 0.05);
}

// ---------------------------------------------------------------------------------------------
// The activation plan (recompute_plan.h)

TEST(RecomputePlan, TinyConfigActivationsShrinkByExactlyTheDroppedBuffers) {
  expect_plan_shrinks_exactly(load_config("tiny"), Device::CPU, 1);
}

TEST(RecomputePlan, DenseLayerSharedExpertAndTwoLeaseSlotsShrinkByExactlyTheDroppedBuffers) {
  const Config cfg = load_config("tiny", {"model.num_hidden_layers=4", "model.first_k_dense_replace=2",
                                          "model.dense_intermediate_size=96", "model.shared_expert_intermediate_size=32",
                                          "model.qk_norm=\"per_head\"", "model.num_key_value_heads=2"});
  expect_plan_shrinks_exactly(cfg, Device::CPU, 2);
}

// Block recompute keeps no lease pool: a lease is refused with a message naming the setting, and
// the dispatcher's recompute pair exists only then.
TEST(RecomputePlan, BlockRecomputeUsesTheSharedRecomputePairInsteadOfLeases) {
  const Config cfg = load_config("tiny");
  const ModelConfig& mc = cfg.model;
  for (Recompute r : {Recompute::None, Recompute::Block}) {
    Arena acts("activations");
    LocalDispatcher dispatcher(mc.num_experts, mc.capacity_factor, mc.dropless);
    Transformer model(mc, 1, 16, acts, dispatcher, 1, r);
    acts.commit();
    if (r == Recompute::Block) {
      EXPECT_EQ(acts.bytes_with_prefix("dispatch.layer."), 0u);
      EXPECT_GT(acts.bytes_with_prefix("dispatch.recompute."), 0u);
      EXPECT_EQ(dispatcher.recompute_buffers().expert_in.dim(0), model.expert_rows());
      try {
        dispatcher.acquire(0);
        ADD_FAILURE() << "a lease was granted under recompute = block";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("train.recompute"), std::string::npos) << e.what();
      }
    } else {
      EXPECT_GT(acts.bytes_with_prefix("dispatch.layer."), 0u);
      EXPECT_EQ(acts.bytes_with_prefix("dispatch.recompute."), 0u);
      EXPECT_THROW(dispatcher.recompute_buffers(), Error);
    }
  }
}

}  // namespace
}  // namespace moe

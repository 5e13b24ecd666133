// Selective activation recompute (train.recompute) on the GPU: every mode's gradients equal those
// of no recompute within the GPU's run-to-run nondeterminism (cuDNN's attention backward), in BF16
// and (experts) in FP8 with either dispatch payload (the FP8 tests need Hopper), and a
// recomputing step captured as one CUDA graph (the re-dispatch and the recomputed blocks make no
// host read) replays with the losses of eager execution; the GPU plan shrinks by exactly the
// dropped buffers. Skipped with the reason where no GPU is usable (the plan test needs none).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "../train/train_test_util.h"
#include "../model/recompute_plan.h"
#include "gpu_test_util.h"
#include "moe/core/device.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

using testing::local_world;
using testing::small_config;
using testing::TempDir;

const std::vector<std::string> kRecomputeModes = {"experts", "attention", "block"};

// Head dim 16 (cuDNN needs a multiple of 8), a dense first layer, then two MoE layers of 8
// experts top-2 with a shared expert; learned routing with drops.
Config gpu_config(const std::string& dir, const std::string& recompute, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"run.device=\"cuda\"",
                                "model.hidden_size=64",
                                "model.intermediate_size=64",
                                "model.num_hidden_layers=3",
                                "model.first_k_dense_replace=1",
                                "model.dense_intermediate_size=128",
                                "model.shared_expert_intermediate_size=64",
                                "model.capacity_factor=0.75",
                                "train.seq_len=64",
                                "train.lr=3e-3",
                                "train.recompute=\"" + recompute + "\""};
  o.insert(o.end(), extra.begin(), extra.end());
  return small_config(dir, o);
}

TrainOptions quiet_bench() {
  TrainOptions opts;
  opts.bench = true;  // nothing written to disk
  opts.quiet = true;
  return opts;
}

std::map<std::string, std::vector<float>> first_step_gradients(Trainer& t) {
  std::map<std::string, std::vector<float>> out;
  t.accumulate_gradients(0);
  t.store().reduced_gradients([&](const std::string& name, int64_t begin, int64_t end, const float* data) {
    out[name].assign(data, data + (end - begin));
  });
  return out;
}

// The recomputed forward runs the same kernels on the same inputs, so it reproduces the saved
// activations; the routing is the saved one. What remains is cuDNN's attention backward, which is
// not bitwise deterministic: every parameter's gradient within 1e-5 relative L2 (the bound the
// train-step tests use for two runs of one step).
TEST(GpuRecompute, EveryModesGradientsMatchNoRecomputeWithinTheGpusNondeterminism) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir dir;
  Trainer none(gpu_config(dir.path, "none"), quiet_bench(), local_world());
  ASSERT_EQ(none.device(), Device::CUDA);
  const auto want = first_step_gradients(none);
  ASSERT_TRUE(want.count("model.layers.0.mlp.gate_proj.weight"));
  ASSERT_TRUE(want.count("model.layers.1.mlp.shared_expert.up_proj.weight"));
  constexpr double kGradRelTol = 1e-5;
  for (const std::string& mode : kRecomputeModes) {
    Trainer t(gpu_config(dir.path, mode), quiet_bench(), local_world());
    const auto got = first_step_gradients(t);
    ASSERT_EQ(got.size(), want.size()) << mode;
    double worst = 0;
    for (const auto& [name, g] : want) {
      const std::vector<float>& h = got.at(name);
      ASSERT_EQ(h.size(), g.size()) << mode << ": " << name;
      ASSERT_TRUE(std::all_of(h.begin(), h.end(), [](float v) { return std::isfinite(v); })) << mode << ": " << name;
      const double err = testing::rel_l2(h, g);
      worst = std::max(worst, err);
      EXPECT_LE(err, kGradRelTol) << "recompute = " << mode << ": gradient of " << name;
    }
    std::printf("  recompute = %s: worst relative L2 gradient error %.2e\n", mode.c_str(), worst);
  }
}

// Each mode, captured: step 1 eager, step 2 captured, later steps replayed; the losses and gradient
// norms of eager execution of the same mode (and of no recompute) within the bounds of the
// train-step graph test.
TEST(GpuRecompute, RecomputingStepCapturedAsOneGraphGivesTheEagerLosses) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir dir;
  const std::vector<std::string> steps = {"train.steps=6"};
  std::vector<std::string> graph_steps = steps;
  graph_steps.push_back("train.cuda_graph=true");
  const TrainSummary none = Trainer(gpu_config(dir.path, "none", steps), quiet_bench(), local_world()).run();
  constexpr double kReplayRelTol = 1e-4;
  for (const std::string& mode : kRecomputeModes) {
    const TrainSummary eager = Trainer(gpu_config(dir.path, mode, steps), quiet_bench(), local_world()).run();
    const TrainSummary graph = Trainer(gpu_config(dir.path, mode, graph_steps), quiet_bench(), local_world()).run();
    ASSERT_EQ(eager.steps.size(), 6u) << mode;
    ASSERT_EQ(graph.steps.size(), 6u) << mode;
    EXPECT_GT(graph.graph_nodes, 0u) << "recompute = " << mode << ": the step was not captured";
    for (size_t i = 0; i < eager.steps.size(); ++i) {
      SCOPED_TRACE("recompute = " + mode + ", step " + std::to_string(i + 1));
      EXPECT_NEAR(graph.steps[i].loss, eager.steps[i].loss, kReplayRelTol * eager.steps[i].loss);
      EXPECT_NEAR(graph.steps[i].grad_norm, eager.steps[i].grad_norm, 1e-3 * eager.steps[i].grad_norm);
      EXPECT_NEAR(eager.steps[i].loss, none.steps[i].loss, kReplayRelTol * none.steps[i].loss);
    }
  }
}

// recompute = experts in FP8: the recomputed gate/up product quantizes the kept BF16 expert input
// again (ep.payload = "bf16") or reads the kept FP8 rows (ep.payload = "fp8"). Either way the
// gradients are those of no recompute in the same precision (the FP8 products are deterministic;
// cuDNN's attention backward bounds the difference as above), and the step captured as one graph
// replays the eager losses.
TEST(GpuRecompute, ExpertsRecomputeInFp8GivesTheNoRecomputeGradientsAndCaptures) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir dir;
  constexpr double kGradRelTol = 1e-5, kReplayRelTol = 1e-4;
  for (const std::string payload : {"bf16", "fp8"}) {
    SCOPED_TRACE("ep.payload = " + payload);
    auto config = [&](const std::string& recompute, std::vector<std::string> extra) {
      extra.insert(extra.end(), {"model.hidden_size=128", "model.intermediate_size=128",
                                 "model.dense_intermediate_size=256", "model.shared_expert_intermediate_size=128",
                                 "train.precision=\"fp8\"", "ep.payload=\"" + payload + "\""});
      return gpu_config(dir.path, recompute, extra);
    };
    Trainer none(config("none", {}), quiet_bench(), local_world());
    const auto want = first_step_gradients(none);
    Trainer experts(config("experts", {}), quiet_bench(), local_world());
    const auto got = first_step_gradients(experts);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, g] : want) EXPECT_LE(testing::rel_l2(got.at(name), g), kGradRelTol) << name;

    const TrainSummary eager = Trainer(config("experts", {"train.steps=4"}), quiet_bench(), local_world()).run();
    const TrainSummary graph =
        Trainer(config("experts", {"train.steps=4", "train.cuda_graph=true"}), quiet_bench(), local_world()).run();
    EXPECT_GT(graph.graph_nodes, 0u);
    ASSERT_EQ(graph.steps.size(), eager.steps.size());
    for (size_t i = 0; i < eager.steps.size(); ++i)
      EXPECT_NEAR(graph.steps[i].loss, eager.steps[i].loss, kReplayRelTol * eager.steps[i].loss) << "step " << i + 1;
  }
}

// The GPU plan (BF16 activations), planned on a CUDA arena that is never committed (so this runs
// without a GPU too): experts < none, block < attention < none, each by exactly the dropped
// buffers. Prints the plans of the tiny model and the single-H200 benchmark model.
TEST(GpuRecompute, GpuActivationPlanShrinksByExactlyTheDroppedBuffers) {
  const Config tiny = load_config("tiny");
  const Config bench = load_config(std::string(MOE_SOURCE_DIR) + "/configs/bench-olmoe-4l.toml");
  for (const Config* cfg : {&tiny, &bench}) {
    testing::expect_plan_shrinks_exactly(*cfg, Device::CUDA, 1);
    for (Recompute r : {Recompute::None, Recompute::Experts, Recompute::Attention, Recompute::Block}) {
      const testing::PlanBytes p = testing::planned_bytes(*cfg, r, Device::CUDA, 1);
      std::printf("  %s, recompute = %-9s: activations %s + expert buffers %s = %s\n", cfg->name.c_str(), to_string(r),
                  format_bytes(static_cast<double>(p.activations)).c_str(),
                  format_bytes(static_cast<double>(p.expert_buffers)).c_str(),
                  format_bytes(static_cast<double>(p.total())).c_str());
    }
  }
}

}  // namespace
}  // namespace moe

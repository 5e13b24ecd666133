// The GPU training path against the CPU one (DESIGN.md section 10, issue 5): a whole tiny step
// (losses and every parameter's gradient) within BF16 tolerance, 50 steps whose loss curve tracks
// the CPU run, and the step captured as one CUDA graph replaying with the losses of eager
// execution. Skipped with the reason where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#if defined(MOE_HAVE_CUDA)
#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"
#endif

#include "gpu_test_util.h"
#include "../train/train_test_util.h"
#include "moe/core/device.h"
#include "moe/model/weights.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

using testing::local_world;
using testing::small_config;
using testing::TempDir;

// Head dim 16 (cuDNN needs a multiple of 8), two MoE layers of 8 experts, top-2.
Config gpu_config(const std::string& dir, const std::string& device, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"run.device=\"" + device + "\"", "model.hidden_size=64", "model.intermediate_size=64",
                                "train.seq_len=64", "train.lr=3e-3"};
  o.insert(o.end(), extra.begin(), extra.end());
  return small_config(dir, o);
}

TrainOptions quiet_bench() {
  TrainOptions opts;
  opts.bench = true;  // nothing written to disk
  opts.quiet = true;
  return opts;
}

// name -> reduced gradient of the first step's accumulation (host copy).
std::map<std::string, std::vector<float>> first_step_gradients(Trainer& t) {
  std::map<std::string, std::vector<float>> out;
  t.accumulate_gradients(0);
  t.store().reduced_gradients([&](const std::string& name, int64_t begin, int64_t end, const float* data) {
    out[name].assign(data, data + (end - begin));
  });
  return out;
}

TEST(GpuTrainStep, PicksTheGpuAndPlansItsMemoryThere) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir dir;
  Trainer t(gpu_config(dir.path, "auto"), quiet_bench(), local_world());
  EXPECT_EQ(t.device(), Device::CUDA);
}

// Largest relative L2 error over the parameters, printing each.
double worst_gradient_error(const std::map<std::string, std::vector<float>>& ref,
                            const std::map<std::string, std::vector<float>>& got, const char* label) {
  EXPECT_EQ(ref.size(), got.size());
  double worst = 0;
  for (const auto& [name, g] : ref) {
    if (!got.count(name) || got.at(name).size() != g.size()) {
      ADD_FAILURE() << "gradient of " << name << " missing or of another size";
      continue;
    }
    const double err = testing::rel_l2(got.at(name), g);
    std::printf("  [%s] %-44s relative L2 error %.2e\n", label, name.c_str(), err);
    worst = std::max(worst, err);
  }
  return worst;
}

// With the routing fixed (uniform), CPU and GPU send every token to the same experts, so every
// gradient differs only by BF16 rounding: within 3% in relative L2 norm for every parameter.
TEST(GpuTrainStep, GradientsMatchTheCpuWithinBf16Tolerance) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir dir;
  const std::vector<std::string> uniform = {"model.routing=\"uniform\""};
  Trainer cpu(gpu_config(dir.path, "cpu", uniform), quiet_bench(), local_world());
  Trainer gpu(gpu_config(dir.path, "cuda", uniform), quiet_bench(), local_world());
  constexpr double kGradRelTol = 3e-2;
  EXPECT_LE(worst_gradient_error(first_step_gradients(cpu), first_step_gradients(gpu), "uniform"), kGradRelTol);
}

// A dense first layer and a shared expert (the Figure-4 model's parts) on the GPU: their fused
// gate/up views over the BF16 compute weights, and every gradient within the same 3% of the CPU's.
TEST(GpuTrainStep, DenseLayerAndSharedExpertGradientsMatchTheCpu) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir dir;
  const std::vector<std::string> o = {"model.routing=\"uniform\"", "model.first_k_dense_replace=1",
                                      "model.dense_intermediate_size=128", "model.shared_expert_intermediate_size=64"};
  Trainer cpu(gpu_config(dir.path, "cpu", o), quiet_bench(), local_world());
  Trainer gpu(gpu_config(dir.path, "cuda", o), quiet_bench(), local_world());
  const auto ref = first_step_gradients(cpu), got = first_step_gradients(gpu);
  ASSERT_TRUE(ref.count("model.layers.0.mlp.gate_proj.weight"));
  ASSERT_TRUE(ref.count("model.layers.1.mlp.shared_expert.up_proj.weight"));
  constexpr double kGradRelTol = 3e-2;
  EXPECT_LE(worst_gradient_error(ref, got, "dense+shared"), kGradRelTol);
}

// With learned routing, BF16 router inputs flip the top-K choice of tokens whose logits nearly
// tie (at initialization most do), which moves whole rows between experts: the expert, router
// and norm gradients then differ by more than rounding. The bar here is on the whole gradient:
// within 10% in relative L2 norm summed over all parameters; the 50-step test checks the loss.
TEST(GpuTrainStep, LearnedRoutingGradientsStayClose) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir dir;
  Trainer cpu(gpu_config(dir.path, "cpu"), quiet_bench(), local_world());
  Trainer gpu(gpu_config(dir.path, "cuda"), quiet_bench(), local_world());
  const auto ref = first_step_gradients(cpu), got = first_step_gradients(gpu);
  worst_gradient_error(ref, got, "learned");
  std::vector<float> all_ref, all_got;
  for (const auto& [name, g] : ref) {
    all_ref.insert(all_ref.end(), g.begin(), g.end());
    all_got.insert(all_got.end(), got.at(name).begin(), got.at(name).end());
  }
  constexpr double kWholeGradRelTol = 1e-1;
  const double err = testing::rel_l2(all_got, all_ref);
  std::printf("  whole gradient: relative L2 error %.2e\n", err);
  EXPECT_LE(err, kWholeGradRelTol);
}

// The GPU's first microbatch writes the routed-expert gradients and zero_grads leaves them alone:
// stale values there before a step (NaN here) change nothing. Two microbatches, so the second
// adds onto what the first wrote. Within 1e-5 relative L2 of a clean run (cuDNN's attention
// backward is not bitwise deterministic).
TEST(GpuTrainStep, StaleExpertGradientsBeforeAStepChangeNothing) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  TempDir dir;
  const Config cfg = gpu_config(dir.path, "cuda");
  ASSERT_EQ(cfg.accumulation_steps(1), 2);
  Trainer clean(cfg, quiet_bench(), local_world());
  Trainer stale(cfg, quiet_bench(), local_world());
  int poisoned = 0;
  for (const LayerWeights& l : stale.store().grads().layers) {
    for (const Tensor& t : {l.experts_gate_up, l.experts_down}) {
      if (t.empty()) continue;
      CUDA_CHECK(cudaMemset(t.data, 0xff, t.nbytes()));  // all-ones bits: NaN
      ++poisoned;
    }
  }
  ASSERT_GT(poisoned, 0);
  const auto want = first_step_gradients(clean), got = first_step_gradients(stale);
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, g] : want) {
    const std::vector<float>& s = got.at(name);
    ASSERT_TRUE(std::all_of(s.begin(), s.end(), [](float v) { return std::isfinite(v); })) << name;
    EXPECT_LE(testing::rel_l2(s, g), 1e-5) << name;
  }
#endif
}

TEST(GpuTrainStep, FiftyStepsTrackTheCpuLossCurve) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir dir;
  const std::vector<std::string> steps = {"train.steps=50"};
  Trainer cpu(gpu_config(dir.path, "cpu", steps), quiet_bench(), local_world());
  Trainer gpu(gpu_config(dir.path, "cuda", steps), quiet_bench(), local_world());
  const TrainSummary a = cpu.run(), b = gpu.run();
  ASSERT_EQ(a.steps.size(), 50u);
  ASSERT_EQ(b.steps.size(), 50u);
  // The first loss is the same model on the same batch: BF16 rounding only.
  EXPECT_NEAR(b.steps[0].loss, a.steps[0].loss, 1e-2 * a.steps[0].loss);
  // Every later step within 3% of the CPU loss, and both runs learn (the loss falls by > 15%).
  constexpr double kCurveRelTol = 3e-2;
  for (size_t i = 0; i < a.steps.size(); ++i)
    EXPECT_NEAR(b.steps[i].loss, a.steps[i].loss, kCurveRelTol * a.steps[i].loss) << "step " << i + 1;
  EXPECT_LT(a.steps.back().loss, 0.85 * a.steps.front().loss);
  EXPECT_LT(b.steps.back().loss, 0.85 * b.steps.front().loss);
  EXPECT_EQ(b.skipped_steps, 0);
}

TEST(GpuTrainStep, GraphReplayGivesTheLossesOfEagerExecution) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir dir;
  const std::vector<std::string> steps = {"train.steps=8"};
  std::vector<std::string> graph_steps = steps;
  graph_steps.push_back("train.cuda_graph=true");
  Trainer eager(gpu_config(dir.path, "cuda", steps), quiet_bench(), local_world());
  Trainer graph(gpu_config(dir.path, "cuda", graph_steps), quiet_bench(), local_world());
  const TrainSummary a = eager.run(), b = graph.run();
  ASSERT_EQ(a.steps.size(), b.steps.size());
  EXPECT_GT(b.graph_nodes, 0u) << "the step was not captured";
  EXPECT_EQ(a.graph_nodes, 0u);
  // The same kernels in the same order; the only run-to-run difference is cuDNN's attention
  // backward, which is not bitwise deterministic: losses agree to 1e-4 relative.
  constexpr double kReplayRelTol = 1e-4;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_NEAR(b.steps[i].loss, a.steps[i].loss, kReplayRelTol * a.steps[i].loss) << "step " << i + 1;
    EXPECT_NEAR(b.steps[i].grad_norm, a.steps[i].grad_norm, 1e-3 * a.steps[i].grad_norm) << "step " << i + 1;
  }
}

// train.deterministic: the attention backward in cuDNN's deterministic algorithm makes the GPU run
// repeat bit for bit: two eager runs and a replayed CUDA graph give the same losses and gradient
// norms at every step (exact equality, where the default backward leaves ~1e-5 between runs), and
// two trainers' first-step gradients are the same bits.
TEST(GpuTrainStep, DeterministicRunsRepeatBitForBit) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir dir;
  const auto config = [&](std::vector<std::string> extra) { return gpu_config(dir.path, "cuda", std::move(extra)); };
  Trainer first(config({"train.deterministic=true"}), quiet_bench(), local_world());
  Trainer second(config({"train.deterministic=true"}), quiet_bench(), local_world());
  ASSERT_TRUE(first.model().deterministic());
  const auto g1 = first_step_gradients(first), g2 = first_step_gradients(second);
  ASSERT_EQ(g1.size(), g2.size());
  for (const auto& [name, g] : g1) EXPECT_EQ(g, g2.at(name)) << name << ": gradients differ between two runs";
  testing::expect_deterministic_runs_repeat(config, quiet_bench(), local_world(), 8);
}

// train.async_save on the GPU: the host copy is taken from device memory through the compute
// stream at the save step; with train.deterministic the two runs train the same bits, so the
// background run's checkpoints (rank file and index) equal the foreground run's byte for byte.
// Steps 3, 6 and 9 are saved in the background, the later two into the host copy kept from the
// first (page-locked for the GPU).
TEST(GpuTrainStep, BackgroundCheckpointsEqualForegroundOnes) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir fg, bg;
  const std::vector<std::string> o = {"train.steps=9", "train.save_every=3", "train.deterministic=true"};
  std::vector<std::string> async = o;
  async.push_back("train.async_save=true");
  TrainOptions opts;
  opts.quiet = true;
  { Trainer t(gpu_config(fg.path, "cuda", o), opts, local_world()); t.run(); }
  { Trainer t(gpu_config(bg.path, "cuda", async), opts, local_world()); t.run(); }
  const auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  for (const char* step : {"/step-000003", "/step-000006", "/step-000009"})
    for (const char* file : {"/rank-00000.safetensors", "/index.json"}) {
      const std::string a = bytes(fg.path + step + file), b = bytes(bg.path + step + file);
      EXPECT_FALSE(a.empty()) << step << file;
      EXPECT_TRUE(a == b) << step << file << " differs from the foreground run's";
    }
}

// BF16 AdamW moments (optim.moment_dtype = "bf16") on the GPU: 30 steps captured as a CUDA graph
// track the CPU run with BF16 moments within the 3% of the FP32-moment curve test; the FSDP store
// trains with them too (its loss falls, nothing skipped); and a GPU checkpoint of FP32 moments
// resumes with BF16 moments (converted through host staging) with the uninterrupted run's next
// loss (1e-4 relative: cuDNN's attention backward is not bitwise deterministic).
TEST(GpuTrainStep, Bf16MomentsTrackTheCpuAndResumeAnFp32Checkpoint) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir dir;
  const std::string bf16 = "optim.moment_dtype=\"bf16\"";
  Trainer cpu(gpu_config(dir.path, "cpu", {"train.steps=30", bf16}), quiet_bench(), local_world());
  Trainer gpu(gpu_config(dir.path, "cuda", {"train.steps=30", bf16, "train.cuda_graph=true"}), quiet_bench(),
              local_world());
  const TrainSummary a = cpu.run(), b = gpu.run();
  ASSERT_EQ(b.steps.size(), 30u);
  EXPECT_GT(b.graph_nodes, 0u) << "the step was not captured";
  for (size_t i = 0; i < a.steps.size(); ++i)
    EXPECT_NEAR(b.steps[i].loss, a.steps[i].loss, 3e-2 * a.steps[i].loss) << "step " << i + 1;
  // Both learn: 30 steps of this model take the loss down by about 9% on the
  // H200 and the CPU alike; the bar is 5%.
  EXPECT_LT(a.steps.back().loss, 0.95 * a.steps.front().loss);
  EXPECT_LT(b.steps.back().loss, 0.95 * b.steps.front().loss);
  EXPECT_EQ(b.skipped_steps, 0);

  Trainer fsdp(gpu_config(dir.path, "cuda", {"train.steps=10", bf16, "parallel.mode=\"fsdp\""}), quiet_bench(),
               local_world());
  const TrainSummary f = fsdp.run();
  EXPECT_LT(f.steps.back().loss, f.steps.front().loss);
  EXPECT_EQ(f.skipped_steps, 0);

  TempDir full_dir, split_dir;
  TrainOptions quiet;
  quiet.quiet = true;
  const TrainSummary full = Trainer(gpu_config(full_dir.path, "cuda", {"train.steps=6"}), quiet, local_world()).run();
  Trainer(gpu_config(split_dir.path, "cuda", {"train.steps=6", "train.save_every=3"}), quiet, local_world()).run();
  TrainOptions resume = quiet;
  resume.resume = split_dir.path + "/step-000003";
  Trainer resumed(gpu_config(split_dir.path, "cuda", {"train.steps=6", "train.save_every=3", bf16}), resume,
                  local_world());
  const TrainSummary r = resumed.run();
  ASSERT_EQ(r.first_step, 3);
  ASSERT_EQ(r.steps.size(), 3u);
  EXPECT_NEAR(r.steps[0].loss, full.steps[3].loss, 1e-4 * full.steps[3].loss);
  EXPECT_EQ(r.skipped_steps, 0);
}

// The FSDP baseline on the GPU (BF16 shard copies gathered per block, FP32 gradients
// reduce-scattered, AdamW on the shards) trains the same model as DDP: on one GPU the two differ
// only in summation orders (the gradient norm over another layout, cuDNN's backward), so ten
// losses agree to 1e-3 relative. It refuses CUDA-graph capture with the reason.
TEST(GpuTrainStep, FsdpOnTheGpuGivesTheLossesOfDdp) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir dir;
  const std::vector<std::string> steps = {"train.steps=10"};
  std::vector<std::string> fsdp_steps = steps;
  fsdp_steps.push_back("parallel.mode=\"fsdp\"");
  Trainer ddp(gpu_config(dir.path, "cuda", steps), quiet_bench(), local_world());
  Trainer fsdp(gpu_config(dir.path, "cuda", fsdp_steps), quiet_bench(), local_world());
  ASSERT_EQ(fsdp.device(), Device::CUDA);
  const TrainSummary a = ddp.run(), b = fsdp.run();
  ASSERT_EQ(a.steps.size(), 10u);
  ASSERT_EQ(b.steps.size(), 10u);
  constexpr double kFsdpRelTol = 1e-3;
  for (size_t i = 0; i < a.steps.size(); ++i)
    EXPECT_NEAR(b.steps[i].loss, a.steps[i].loss, kFsdpRelTol * a.steps[i].loss) << "step " << i + 1;
  EXPECT_LT(b.steps.back().loss, b.steps.front().loss);

  fsdp_steps.push_back("train.cuda_graph=true");
  try {
    Trainer graph(gpu_config(dir.path, "cuda", fsdp_steps), quiet_bench(), local_world());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.mode = \"fsdp\""), std::string::npos) << e.what();
  }
}

// A config far larger than the GPU fails at start-up, before any work, with its bytes by role and
// the levers that were planned (memory_plan.h).
TEST(GpuTrainStep, AConfigThatDoesNotFitFailsBeforeTheFirstStepWithTheNumbers) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir dir;
  try {
    Trainer t(gpu_config(dir.path, "cuda", {"model.num_experts=1024", "model.intermediate_size=16384",
                                            "model.hidden_size=1024"}),
              quiet_bench(), local_world());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    // The bytes by role, and the levers planned: none of them fits a model of ~60B parameters.
    EXPECT_NE(m.find("parameters + gradients + optimizer take"), std::string::npos) << m;
    EXPECT_NE(m.find("optim.moment_dtype = \"bf16\": saves"), std::string::npos) << m;
    EXPECT_NE(m.find("none of these fits at 1 rank"), std::string::npos) << m;
  }
}

TEST(GpuTrainStep, RandomRoutingRefusesGraphCapture) {
  MOE_SKIP_WITHOUT_GPU();
  TempDir dir;
  try {
    Trainer t(gpu_config(dir.path, "cuda", {"train.cuda_graph=true", "model.routing=\"random\""}), quiet_bench(),
              local_world());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.routing = \"random\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moe

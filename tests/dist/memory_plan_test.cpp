// ranks: 1 2 4
// `moetrain plan` is the run's own planning code on stand-in ranks: for several configs and
// topologies (DDP at ep = 1, 2 and the world with rowwise and alltoall dispatch, the FSDP
// baseline, every recompute mode, BF16 moments, several microbatches, FP8 precision and payload,
// FP8 pipeline stages),
// each rank's plan equals, role by role and byte for byte, the arenas (and the rowwise heap) of a real CPU run of that
// config on this job's ranks. And a config that does not fit names options that were planned:
// each option's bytes are those of the config it names.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "moe/comm/mpi_communicator.h"
#include "moe/model/weights.h"
#include "moe/train/memory_plan.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

std::vector<std::string> base(int world) {
  return {"run.device=\"cpu\"",
          "model.hidden_size=32",
          "model.intermediate_size=16",
          "model.num_experts=8",
          "model.num_experts_per_tok=2",
          "train.seq_len=16",
          "train.micro_batch_size=2",
          "train.global_batch_size=" + std::to_string(4 * world),
          "train.steps=1",
          "run.save_final=false",
          "data.synthetic_tokens=20000",
          "data.synthetic_eval_tokens=2000"};
}

// base(world) with a variant's settings, and how a failure names it.
Config variant_config(int world, const std::vector<std::string>& variant) {
  std::vector<std::string> o = base(world);
  o.insert(o.end(), variant.begin(), variant.end());
  return load_config("tiny", o);
}
std::string describe(const Communicator& world, const std::vector<std::string>& variant) {
  std::string what = "rank " + std::to_string(world.rank()) + " of " + std::to_string(world.size()) + ":";
  for (const auto& s : variant) what += " " + s;
  return what;
}

void expect_equal(const MemoryRoles& plan, const MemoryRoles& run, const std::string& what) {
  EXPECT_EQ(plan.parameters, run.parameters) << what;
  EXPECT_EQ(plan.compute_weights, run.compute_weights) << what;
  EXPECT_EQ(plan.gradients, run.gradients) << what;
  EXPECT_EQ(plan.optimizer, run.optimizer) << what;
  EXPECT_EQ(plan.other_state, run.other_state) << what;
  EXPECT_EQ(plan.activations, run.activations) << what;
  EXPECT_EQ(plan.expert_buffers, run.expert_buffers) << what;
  EXPECT_EQ(plan.heap, run.heap) << what;
  EXPECT_GT(plan.total(), 0u) << what;
}

class MemoryPlan : public ::testing::Test {
 protected:
  void SetUp() override { world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD); }
  std::unique_ptr<MpiCommunicator> world_;
};

TEST_F(MemoryPlan, EachRanksPlanEqualsTheArenasOfTheRealRun) {
  const int P = world_->size();
  std::vector<std::vector<std::string>> variants = {
      {},
      {"parallel.mode=\"fsdp\""},
      {"train.recompute=\"experts\""},
      {"train.recompute=\"attention\""},
      {"train.recompute=\"block\"", "optim.moment_dtype=\"bf16\""},
      {"train.micro_batch_size=1", "model.capacity_factor=1.5", "model.dropless=false"},
      {"train.precision=\"fp8\""},  // the FP8 caches (compute weights) and operand scratch (activations)
      {"train.precision=\"fp8\"", "ep.payload=\"fp8\""},  // FP8 expert inputs (codes + scales)
      {"train.precision=\"fp8\"", "ep.payload=\"fp8\"", "train.recompute=\"block\""},
  };
  if (P > 1) {
    variants.push_back({"parallel.ep=2"});
    variants.push_back({"parallel.ep=2", "ep.backend=\"alltoall\""});
    variants.push_back({"parallel.ep=" + std::to_string(P), "train.recompute=\"block\""});
    variants.push_back({"parallel.ep=2", "train.precision=\"fp8\""});
    variants.push_back({"parallel.ep=2", "train.precision=\"fp8\"", "ep.payload=\"fp8\""});  // in the heap
    variants.push_back({"parallel.ep=" + std::to_string(P), "train.precision=\"fp8\"", "ep.payload=\"fp8\"",
                        "train.recompute=\"block\""});
    variants.push_back({"parallel.pp=2", "train.precision=\"fp8\""});  // each stage caches its own layers
  }
  TrainOptions quiet;
  quiet.quiet = true;
  quiet.bench = true;
  for (const auto& v : variants) {
    const std::string what = describe(*world_, v);
    const Config cfg = variant_config(P, v);
    const Trainer run(cfg, quiet, *world_);
    expect_equal(plan_rank(cfg, P, world_->rank(), Device::CPU), run.memory_plan(), what);
  }
}

// `moetrain eval`'s trainer (TrainOptions::evaluation_only) holds the weights alone: its plan is
// its arenas, byte for byte, with no gradients and no optimizer state, on every topology eval
// runs (DDP with EP, the FSDP baseline, pipeline stages, FP8), and it evaluates what a training
// trainer with the same weights does, bit for bit.
TEST_F(MemoryPlan, AnEvaluationPlansItsWeightsAloneAndEvaluatesAsTrainingDoes) {
  const int P = world_->size();
  std::vector<std::vector<std::string>> variants = {{}, {"parallel.mode=\"fsdp\""}, {"train.precision=\"fp8\""}};
  if (P > 1) {
    variants.push_back({"parallel.ep=2"});
    variants.push_back({"parallel.ep=2", "train.precision=\"fp8\"", "ep.payload=\"fp8\""});
    variants.push_back({"parallel.pp=2"});
  }
  TrainOptions training, evaluation;
  training.quiet = training.bench = true;
  evaluation = training;
  evaluation.evaluation_only = true;
  for (const auto& v : variants) {
    const std::string what = describe(*world_, v);
    const Config cfg = variant_config(P, v);
    Trainer train(cfg, training, *world_);
    Trainer eval(cfg, evaluation, *world_);
    const MemoryRoles e = eval.memory_plan(), t = train.memory_plan();
    expect_equal(plan_rank(cfg, P, world_->rank(), Device::CPU, StoreUse::Evaluation), e, what);
    EXPECT_EQ(e.gradients, 0u) << what;
    EXPECT_EQ(e.optimizer, 0u) << what;
    EXPECT_GT(t.gradients + t.optimizer, 0u) << what;
    EXPECT_EQ(e.parameters, t.parameters) << what;
    EXPECT_EQ(e.activations, t.activations) << what;
    const EvalReport a = train.evaluate_data("synthetic", 0), b = eval.evaluate_data("synthetic", 0);
    EXPECT_GT(a.tokens, 0) << what;
    EXPECT_EQ(b.tokens, a.tokens) << what;
    EXPECT_EQ(b.mean_loss, a.mean_loss) << what;
  }
}

TEST_F(MemoryPlan, TheOptionsOfAConfigThatDoesNotFitAreThePlansOfTheConfigsTheyName) {
  const int P = world_->size();
  const Config cfg = load_config("tiny", base(P));
  const MemoryRoles plan = plan_largest_rank(cfg, P, Device::CPU);
  // Room for everything but a third of the activations: recompute or a smaller microbatch fits.
  const size_t usable = plan.total() - plan.activations / 3;
  const std::vector<FitOption> options = fit_options(cfg, P, Device::CPU, usable);
  ASSERT_FALSE(options.empty());
  bool some_fit = false;
  for (const FitOption& o : options) {
    std::vector<std::string> sets = base(P);
    for (const auto& [key, value] : o.changes) sets.push_back(key + "=" + value);
    const Config changed = load_config("tiny", sets);
    const MemoryRoles m = plan_largest_rank(changed, P, Device::CPU);
    EXPECT_EQ(m.total(), o.plan.total()) << o.describe();
    EXPECT_EQ(o.fits, m.total() <= usable) << o.describe();
    some_fit = some_fit || o.fits;
  }
  EXPECT_TRUE(some_fit);
  // BF16 moments halve the moments: the saving the message states is the planned difference.
  const std::string msg = does_not_fit_message(cfg, plan, P, Device::CPU, usable);
  std::vector<std::string> bf16 = base(P);
  bf16.push_back("optim.moment_dtype=\"bf16\"");
  const size_t saved = plan.optimizer - plan_largest_rank(load_config("tiny", bf16), P, Device::CPU).optimizer;
  EXPECT_NE(msg.find("optim.moment_dtype = \"bf16\": saves " + format_bytes(static_cast<double>(saved))),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("cheapest that fits: --set "), std::string::npos) << msg;
}

// An evaluation on the GPU in BF16 keeps the BF16 copy alone (a checkpoint is read straight into
// it): no FP32 weights, two bytes per parameter. In FP8 the FP32 weights stay (the caches are
// quantized from them), with the training plan's compute weights.
TEST_F(MemoryPlan, AnEvaluationOnTheGpuInBf16KeepsTheBf16CopyAlone) {
#if !MOE_HAVE_CUDA
  GTEST_SKIP() << "GPU plans need a build with the CUDA backend (no GPU needed)";
#endif
  const int P = world_->size();
  const Config cfg = load_config("tiny", base(P));
  int64_t all = 0;
  const ParamRegistry reg = build_registry(cfg.model, 0, cfg.model.num_experts);
  for (const ParamEntry& e : reg.entries()) all += e.numel();
  const MemoryRoles bf16 = plan_rank(cfg, 1, 0, Device::CUDA, StoreUse::Evaluation);
  EXPECT_EQ(bf16.parameters, 0u);
  EXPECT_EQ(bf16.compute_weights, static_cast<size_t>(2 * all));
  EXPECT_EQ(bf16.gradients + bf16.optimizer, 0u);
  std::vector<std::string> o = base(P);
  o.push_back("train.precision=\"fp8\"");
  const Config fp8 = load_config("tiny", o);
  const MemoryRoles e = plan_rank(fp8, 1, 0, Device::CUDA, StoreUse::Evaluation);
  const MemoryRoles t = plan_rank(fp8, 1, 0, Device::CUDA);
  EXPECT_EQ(e.parameters, static_cast<size_t>(4 * all));
  EXPECT_EQ(e.compute_weights, t.compute_weights);
  EXPECT_EQ(e.gradients + e.optimizer, 0u);
}

// FP8 on the GPU keeps no BF16 copy of the matrices it quantizes (every *_proj matrix): the GPU
// plan's compute weights exceed the CPU plan's (the same FP8 caches, no BF16 copy at all) by two
// bytes per element of the other tensors (embedding, norms, routers, LM head) exactly. In BF16 the
// GPU copy has every element.
TEST_F(MemoryPlan, Fp8OnTheGpuKeepsABf16CopyOfTheUnquantizedTensorsOnly) {
#if !MOE_HAVE_CUDA
  GTEST_SKIP() << "GPU plans need a build with the CUDA backend (no GPU needed)";
#endif
  const int P = world_->size();
  std::vector<std::string> o = base(P);
  o.push_back("train.precision=\"fp8\"");
  const Config cfg = load_config("tiny", o);
  const ParamRegistry reg = build_registry(cfg.model, 0, cfg.model.num_experts);
  int64_t unquantized = 0, all = 0;
  for (const ParamEntry& e : reg.entries()) {
    all += e.numel();
    if (e.name.find("_proj") == std::string::npos) unquantized += e.numel();
  }
  ASSERT_GT(unquantized, 0);
  ASSERT_LT(unquantized, all);
  const MemoryRoles gpu = plan_rank(cfg, 1, 0, Device::CUDA), cpu = plan_rank(cfg, 1, 0, Device::CPU);
  EXPECT_EQ(gpu.compute_weights - cpu.compute_weights, static_cast<size_t>(2 * unquantized));
  const Config bf16 = load_config("tiny", base(P));
  EXPECT_EQ(plan_rank(bf16, 1, 0, Device::CUDA).compute_weights, static_cast<size_t>(2 * all));
}

// In FP8 a pipeline stage caches the FP8 weights of its own layers only: the stages' caches add up
// to the one-rank run's (on the CPU the compute weights are the caches alone), and neither stage
// holds them all.
TEST_F(MemoryPlan, Fp8PipelineStagesCacheTheirOwnLayers) {
  std::vector<std::string> o = base(2);
  o.push_back("train.precision=\"fp8\"");
  const size_t whole = plan_rank(load_config("tiny", o), 1, 0, Device::CPU).compute_weights;
  o.push_back("parallel.pp=2");
  const Config pp = load_config("tiny", o);
  const size_t first = plan_rank(pp, 2, 0, Device::CPU).compute_weights;
  const size_t last = plan_rank(pp, 2, 1, Device::CPU).compute_weights;
  EXPECT_GT(first, 0u);
  EXPECT_GT(last, 0u);
  EXPECT_EQ(first + last, whole);
}

// On the GPU each FP8 stage also keeps a BF16 copy of its own unquantized tensors only: stage s
// (layers given as [2, 2]) plans two bytes per element of the tensors the stage's registry holds
// outside the projections above its CPU plan (the same caches, no copy).
TEST_F(MemoryPlan, Fp8PipelineStagesOnTheGpuKeepBf16CopiesOfTheirOwnUnquantizedTensors) {
#if !MOE_HAVE_CUDA
  GTEST_SKIP() << "GPU plans need a build with the CUDA backend (no GPU needed)";
#endif
  std::vector<std::string> o = base(2);
  o.insert(o.end(),
           {"train.precision=\"fp8\"", "model.num_hidden_layers=4", "parallel.pp=2", "parallel.pp_layers=[2,2]"});
  const Config cfg = load_config("tiny", o);
  const int64_t L = cfg.model.num_hidden_layers;
  ASSERT_EQ(L, 4);
  for (int stage = 0; stage < 2; ++stage) {
    std::vector<bool> held(static_cast<size_t>(L + 2), false);  // blocks: embedding, layers, final norm + LM head
    for (int64_t l = 2 * stage; l < 2 * stage + 2; ++l) held[static_cast<size_t>(l + 1)] = true;
    held[stage == 0 ? 0 : static_cast<size_t>(L + 1)] = true;
    const ParamRegistry reg = build_registry(cfg.model, 0, cfg.model.num_experts, ParamLayout::ByReplicaGroup, held);
    int64_t unquantized = 0;
    for (const ParamEntry& e : reg.entries())
      if (e.name.find("_proj") == std::string::npos) unquantized += e.numel();
    const MemoryRoles gpu = plan_rank(cfg, 2, stage, Device::CUDA), cpu = plan_rank(cfg, 2, stage, Device::CPU);
    EXPECT_EQ(gpu.compute_weights - cpu.compute_weights, static_cast<size_t>(2 * unquantized)) << "stage " << stage;
  }
}

// On the CPU the trainer's host copy of the step's batch takes the memory the plan is checked
// against: a larger global batch grows the plan by both copies of its tokens and targets (I32,
// 16 bytes per token), not only by the arena's (the plan counted 8, one batch short).
TEST_F(MemoryPlan, OnTheCpuThePlanCountsTheHostCopyOfTheBatch) {
  std::vector<std::string> o = base(1);
  const Config small = load_config("tiny", o);
  o.push_back("train.global_batch_size=64");
  const Config large = load_config("tiny", o);
  const auto tokens = [](const Config& c) {
    return static_cast<size_t>(c.accumulation_steps(1) * c.train.micro_batch_size * c.train.seq_len);
  };
  ASSERT_GT(tokens(large), tokens(small));
  const MemoryRoles a = plan_rank(small, 1, 0, Device::CPU), b = plan_rank(large, 1, 0, Device::CPU);
  EXPECT_EQ(b.other_state - a.other_state, 2 * 2 * sizeof(int32_t) * (tokens(large) - tokens(small)));
  EXPECT_EQ(b.total() - a.total(), b.other_state - a.other_state);
}

// The largest rank of a pipeline is whichever stage holds the most: 1F1B keeps the most
// microbatches in flight on the first stage, but a middle stage may hold more layers (here 5 of
// the 8). plan_largest_rank, which fit_options and the topology search rely on, plans every stage
// (it planned only the first and the last rank).
TEST_F(MemoryPlan, TheLargestRankOfAPipelineIsTheLargestOfEveryStage) {
  std::vector<std::string> o = base(4);
  o.insert(o.end(), {"model.num_hidden_layers=8", "parallel.pp=4", "parallel.pp_layers=[1,5,1,1]"});
  const Config cfg = load_config("tiny", o);
  std::vector<size_t> stage(4);
  for (int r = 0; r < 4; ++r) stage[static_cast<size_t>(r)] = plan_rank(cfg, 4, r, Device::CPU).total();
  const size_t largest = *std::max_element(stage.begin(), stage.end());
  EXPECT_EQ(plan_largest_rank(cfg, 4, Device::CPU).total(), largest);
  EXPECT_GT(std::max(stage[1], stage[2]), std::max(stage[0], stage[3]))
      << "this config no longer makes a middle stage the largest; the test needs one that does";
}

}  // namespace
}  // namespace moe

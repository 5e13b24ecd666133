// `moetrain eval` builds its trainer with TrainOptions::evaluation_only: the store holds the
// weights alone (StoreUse::Evaluation), no gradients and no optimizer state. Its losses must be
// the losses a training store computes from the same checkpoint, bit for bit (the same forward
// on the same weights), its memory exactly the training plan's less the gradients and the
// optimizer, as `plan_rank` plans it, and the training calls must be refused, not run on
// buffers that were never planned.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "moe/ckpt/checkpoint.h"
#include "moe/core/error.h"
#include "moe/train/memory_plan.h"
#include "moe/train/trainer.h"
#include "train_test_util.h"

namespace moe {
namespace {

TrainOptions from_checkpoint(const std::string& ckpt, bool evaluation_only) {
  TrainOptions o;
  o.quiet = o.bench = true;
  o.checkpoint = std::make_shared<const CheckpointReader>(ckpt);
  o.evaluation_only = evaluation_only;
  return o;
}

class EvaluationStore : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(EvaluationStore, EvaluatesTheCheckpointAsATrainingStoreDoesWithoutGradientsOrOptimizerState) {
  testing::TempDir dir;
  std::vector<std::string> sets = GetParam();
  sets.push_back("train.steps=3");
  {
    TrainOptions quiet;
    quiet.quiet = true;
    Trainer(testing::small_config(dir.path, sets), quiet, testing::local_world()).run();
  }
  const std::string ckpt = dir.path + "/step-000003";
  const Config cfg = testing::small_config(dir.path + "-unused", sets);
  Trainer train(cfg, from_checkpoint(ckpt, false), testing::local_world());
  Trainer eval(cfg, from_checkpoint(ckpt, true), testing::local_world());

  // The trained weights, read into either store, give the same losses.
  const double loss = train.microbatch_loss(0);
  EXPECT_EQ(eval.microbatch_loss(0), loss);
  const EvalReport a = train.evaluate_data("synthetic", 0), b = eval.evaluate_data("synthetic", 0);
  EXPECT_GT(a.tokens, 0);
  EXPECT_EQ(b.tokens, a.tokens);
  EXPECT_EQ(b.mean_loss, a.mean_loss);
  // And they are the checkpoint's, not the seed's: a store built fresh gives another loss.
  TrainOptions fresh;
  fresh.quiet = fresh.bench = true;
  fresh.evaluation_only = true;
  EXPECT_NE(Trainer(cfg, fresh, testing::local_world()).microbatch_loss(0), loss);

  // Memory: the training plan less its gradients and optimizer state, role by role, as planned.
  const MemoryRoles t = train.memory_plan(), e = eval.memory_plan();
  EXPECT_GT(t.gradients, 0u);
  EXPECT_GT(t.optimizer, 0u);
  EXPECT_EQ(e.gradients, 0u);
  EXPECT_EQ(e.optimizer, 0u);
  EXPECT_EQ(e.parameters, t.parameters);
  EXPECT_EQ(e.compute_weights, t.compute_weights);
  EXPECT_EQ(e.activations, t.activations);
  // FSDP's gradient staging (the gathered block's gradients, the reduce-scatter output, the norm)
  // is other state in a training plan; an evaluation has none of it.
  EXPECT_LE(e.other_state, t.other_state);
  EXPECT_EQ(e.total(), t.total() - t.gradients - t.optimizer - (t.other_state - e.other_state));
  const MemoryRoles planned = plan_rank(cfg, 1, 0, Device::CPU, StoreUse::Evaluation);
  EXPECT_EQ(planned.total(), e.total());
  EXPECT_EQ(planned.other_state, e.other_state);

  // Training calls on an evaluation's trainer are errors, not writes into unplanned buffers.
  try {
    eval.run();
    ADD_FAILURE() << "run() of an evaluation's trainer did not throw";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("built for evaluation"), std::string::npos) << err.what();
  }
  try {
    eval.train_step(0);
    ADD_FAILURE() << "train_step of an evaluation's trainer did not throw";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("Trainer::train_step: this trainer was built for evaluation"),
              std::string::npos)
        << err.what();
  }
  try {
    eval.store().zero_grads(false);
    ADD_FAILURE() << "zero_grads on an evaluation's store did not throw";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("zero_grads"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("weights only"), std::string::npos) << err.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, EvaluationStore,
                         ::testing::Values(std::vector<std::string>{},
                                           std::vector<std::string>{"train.precision=\"fp8\""},
                                           std::vector<std::string>{"parallel.mode=\"fsdp\""}));

}  // namespace
}  // namespace moe

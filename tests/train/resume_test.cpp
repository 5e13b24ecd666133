// A run stopped at step k and resumed continues with exactly the losses of the uninterrupted run.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "moe/ckpt/checkpoint.h"
#include "moe/train/trainer.h"
#include "train_test_util.h"

namespace moe {
namespace {

std::vector<double> losses(const TrainSummary& s) {
  std::vector<double> out;
  for (const auto& r : s.steps) out.push_back(r.loss);
  return out;
}

void expect_resume_matches(const std::vector<std::string>& extra) {
  testing::TempDir full_dir, split_dir;
  TrainOptions quiet;
  quiet.quiet = true;
  std::vector<std::string> o = extra;
  o.push_back("train.steps=6");
  Trainer full(testing::small_config(full_dir.path, o), quiet, testing::local_world());
  const std::vector<double> uninterrupted = losses(full.run());
  ASSERT_EQ(uninterrupted.size(), 6u);

  // The same 6-step run (same LR schedule) checkpointing every 3 steps; resuming from the step-3
  // checkpoint is what a run stopped at step 3 does.
  o.push_back("train.save_every=3");
  { Trainer t(testing::small_config(split_dir.path, o), quiet, testing::local_world()); t.run(); }
  TrainOptions resume = quiet;
  resume.resume = split_dir.path + "/step-000003";
  Trainer resumed(testing::small_config(split_dir.path, o), resume, testing::local_world());
  const TrainSummary s = resumed.run();
  ASSERT_EQ(s.first_step, 3);
  const std::vector<double> tail = losses(s);
  ASSERT_EQ(tail.size(), 3u);
  for (size_t i = 0; i < tail.size(); ++i)
    EXPECT_EQ(tail[i], uninterrupted[3 + i]) << "step " << 4 + i << " differs after resume (bit-equal expected)";
}

TEST(Resume, LearnedRoutingResumesBitExactly) { expect_resume_matches({}); }

TEST(Resume, RandomRoutingAndRouterBiasResumeBitExactly) {
  // Random routing draws from (seed, step, microbatch); the aux-free bias is checkpointed state.
  expect_resume_matches({"model.routing=\"random\""});
  expect_resume_matches({"model.bias_update_rate=0.01"});
}

TEST(Resume, Bf16MomentsResumeBitExactly) { expect_resume_matches({"optim.moment_dtype=\"bf16\""}); }

// A checkpoint resumes under the other optim.moment_dtype (moments are converted on load; the
// conversion itself is checked in optimizer_moments_test): the first resumed step's loss, which
// depends only on the weights, is the uninterrupted run's bit for bit, and the run goes on.
TEST(Resume, ACheckpointResumesUnderTheOtherMomentDtype) {
  for (const auto& [saved, resumed] : {std::pair{"fp32", "bf16"}, std::pair{"bf16", "fp32"}}) {
    SCOPED_TRACE(std::string("saved with ") + saved + " moments, resumed with " + resumed);
    testing::TempDir full_dir, split_dir;
    TrainOptions quiet;
    quiet.quiet = true;
    const std::string saved_set = std::string("optim.moment_dtype=\"") + saved + "\"";
    Trainer full(testing::small_config(full_dir.path, {"train.steps=6", saved_set}), quiet, testing::local_world());
    const std::vector<double> uninterrupted = losses(full.run());
    {
      Trainer t(testing::small_config(split_dir.path, {"train.steps=6", "train.save_every=3", saved_set}), quiet,
                testing::local_world());
      t.run();
    }
    EXPECT_EQ(CheckpointReader(split_dir.path + "/step-000003").dtype("lm_head.weight.exp_avg"),
              std::string(saved) == "bf16" ? DType::BF16 : DType::F32);
    TrainOptions resume = quiet;
    resume.resume = split_dir.path + "/step-000003";
    Trainer t(testing::small_config(split_dir.path, {"train.steps=6", "train.save_every=3",
                                                     std::string("optim.moment_dtype=\"") + resumed + "\""}),
              resume, testing::local_world());
    const TrainSummary s = t.run();
    ASSERT_EQ(s.first_step, 3);
    const std::vector<double> tail = losses(s);
    ASSERT_EQ(tail.size(), 3u);
    EXPECT_EQ(tail[0], uninterrupted[3]) << "step 4 differs after resume";
    EXPECT_EQ(s.skipped_steps, 0);
  }
}

TEST(Resume, ModelConfigMismatchIsRefusedNamingTheKey) {
  testing::TempDir dir;
  TrainOptions quiet;
  quiet.quiet = true;
  { Trainer t(testing::small_config(dir.path, {"train.steps=1"}), quiet, testing::local_world()); t.run(); }
  TrainOptions resume = quiet;
  resume.resume = "latest";
  try {
    Trainer t(testing::small_config(dir.path, {"train.steps=2", "model.num_experts=4"}), resume, testing::local_world());
    FAIL() << "resume with another model config was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_experts"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moe

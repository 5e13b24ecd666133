// A regression test on learning: a shortened tiny run on the synthetic corpus must get its
// held-out loss close to the corpus's exact attainable loss (its entropy rate).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "moe/train/trainer.h"
#include "train_test_util.h"

namespace moe {
namespace {

TEST(Learning, ShortTinyRunApproachesTheAttainableLoss) {
  testing::TempDir dir;
  TrainOptions quiet;
  quiet.quiet = true;
  // The tiny config at 200 steps of 8 x 64 tokens (a few seconds on 2 cores).
  Config cfg = load_config("tiny", {"run.device=\"cpu\"", "train.steps=200", "train.seq_len=64", "train.global_batch_size=8",
                                    "train.micro_batch_size=4", "train.warmup_steps=10", "train.eval_every=0",
                                    "train.eval_batches=8", "run.save_final=false",
                                    "run.dir=\"" + dir.path + "\""});
  Trainer trainer(cfg, quiet, testing::local_world());
  const TrainSummary s = trainer.run();
  ASSERT_TRUE(s.attainable_loss.has_value());
  ASSERT_TRUE(s.eval_loss.has_value());
  const double initial = s.steps.front().lm_loss, attainable = *s.attainable_loss;
  // Stated bounds: from ln(512) = 6.24 at the start to within 0.8 nats of the attainable 1.53.
  RecordProperty("eval_loss", std::to_string(*s.eval_loss));
  std::printf("initial loss %.4f, held-out loss %.4f, attainable %.4f\n", initial, *s.eval_loss, attainable);
  EXPECT_GT(initial, 6.0);
  EXPECT_LT(*s.eval_loss, attainable + 0.8) << "held-out loss " << *s.eval_loss << ", attainable " << attainable;
  EXPECT_GT(*s.eval_loss, attainable - 0.05) << "held-out loss below the entropy rate: the loss is miscomputed";
  EXPECT_EQ(s.skipped_steps, 0);
}

// BF16 moments learn as FP32 moments do: the 300-step tiny run on the CPU (the shortened batch of
// the test above) ends within 1% of the FP32-moment run's loss, both the held-out loss and the
// mean training loss of the last 20 steps (measured: see the printed differences).
TEST(Learning, Bf16MomentsEndWithinOnePercentOfFp32Moments) {
  auto run = [](const std::string& moment_dtype) {
    testing::TempDir dir;
    TrainOptions quiet;
    quiet.quiet = true;
    Config cfg = load_config("tiny", {"run.device=\"cpu\"", "train.steps=300", "train.seq_len=64",
                                      "train.global_batch_size=8", "train.micro_batch_size=4",
                                      "train.warmup_steps=10", "train.eval_every=0", "train.eval_batches=8",
                                      "run.save_final=false", "optim.moment_dtype=\"" + moment_dtype + "\"",
                                      "run.dir=\"" + dir.path + "\""});
    Trainer trainer(cfg, quiet, testing::local_world());
    return trainer.run();
  };
  const TrainSummary f32 = run("fp32"), bf16 = run("bf16");
  auto tail_mean = [](const TrainSummary& s) {
    double sum = 0;
    for (size_t i = s.steps.size() - 20; i < s.steps.size(); ++i) sum += s.steps[i].lm_loss;
    return sum / 20;
  };
  ASSERT_EQ(f32.steps.size(), 300u);
  ASSERT_EQ(bf16.steps.size(), 300u);
  ASSERT_TRUE(f32.eval_loss.has_value() && bf16.eval_loss.has_value());
  const double eval_rel = (*bf16.eval_loss - *f32.eval_loss) / *f32.eval_loss;
  const double train_rel = (tail_mean(bf16) - tail_mean(f32)) / tail_mean(f32);
  std::printf("held-out loss: fp32 moments %.5f, bf16 moments %.5f (%+.3f%%); last-20-step training loss: %.5f vs %.5f "
              "(%+.3f%%)\n",
              *f32.eval_loss, *bf16.eval_loss, 100 * eval_rel, tail_mean(f32), tail_mean(bf16), 100 * train_rel);
  RecordProperty("eval_loss_relative_difference", std::to_string(eval_rel));
  EXPECT_LT(std::fabs(eval_rel), 0.01);
  EXPECT_LT(std::fabs(train_rel), 0.01);
  EXPECT_NE(*bf16.eval_loss, *f32.eval_loss) << "the runs are identical: the moment dtype had no effect";
  EXPECT_EQ(bf16.skipped_steps, 0);
}

}  // namespace
}  // namespace moe

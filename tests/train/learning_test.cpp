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

}  // namespace
}  // namespace moe

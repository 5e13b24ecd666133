// Learning-rate schedules (optim/lr_schedule.h): every schedule warms up linearly to the peak; cosine
// and linear decay from the peak on the first step after warmup to lr x min_lr_ratio on the last;
// constant stays at the peak; wsd stays at the peak until its last decay_steps steps, each below
// it, which fall linearly to the floor, so a run extended on resume keeps the peak until its new decay. The
// trainer records the schedule's rate per step, and the config refuses decay_steps it would not use.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "moe/core/error.h"
#include "moe/optim/lr_schedule.h"
#include "moe/train/config.h"
#include "moe/train/trainer.h"
#include "train_test_util.h"

namespace moe {
namespace {

constexpr double kPeak = 3e-3, kFloorRatio = 0.1;
constexpr double kTol = 1e-12 * kPeak;  // double arithmetic of a few terms

std::vector<double> curve(LrSchedule s, int64_t total, int64_t warmup, int64_t decay_steps = 0) {
  std::vector<double> lr;
  for (int64_t step = 0; step < total; ++step) lr.push_back(lr_at(step, total, kPeak, warmup, kFloorRatio, s, decay_steps));
  return lr;
}

TEST(LrSchedule, EveryScheduleWarmsUpLinearlyToThePeak) {
  for (LrSchedule s : {LrSchedule::Cosine, LrSchedule::Linear, LrSchedule::Constant, LrSchedule::Wsd}) {
    const std::vector<double> lr = curve(s, 50, 8);
    for (int64_t step = 0; step < 8; ++step) EXPECT_NEAR(lr[step], kPeak * (step + 1) / 8.0, kTol) << step;
    EXPECT_NEAR(lr[8], kPeak, kTol) << "the first step after warmup is at the peak";
  }
}

TEST(LrSchedule, CosineAndLinearFallFromThePeakToTheFloorOnTheLastStep) {
  const int64_t total = 41, warmup = 10;  // 31 decay steps: the middle one is step 25
  for (LrSchedule s : {LrSchedule::Cosine, LrSchedule::Linear}) {
    const std::vector<double> lr = curve(s, total, warmup);
    EXPECT_NEAR(lr.back(), kPeak * kFloorRatio, kTol);
    for (int64_t step = warmup + 1; step < total; ++step) EXPECT_LT(lr[step], lr[step - 1]) << step;
    // Both are symmetric about the middle of the decay: halfway between peak and floor there.
    EXPECT_NEAR(lr[25], kPeak * (1 + kFloorRatio) / 2, kTol);
  }
  // Linear: equal steps down.
  const std::vector<double> lr = curve(LrSchedule::Linear, total, warmup);
  for (int64_t step = warmup + 1; step < total; ++step)
    EXPECT_NEAR(lr[step - 1] - lr[step], kPeak * (1 - kFloorRatio) / 30, kTol) << step;
}

TEST(LrSchedule, ConstantStaysAtThePeak) {
  const std::vector<double> lr = curve(LrSchedule::Constant, 30, 5);
  for (int64_t step = 4; step < 30; ++step) EXPECT_EQ(lr[step], kPeak) << step;
}

TEST(LrSchedule, WsdHoldsThePeakThenDecaysLinearlyOverItsLastSteps) {
  const int64_t total = 40, warmup = 5, decay = 6;
  const std::vector<double> lr = curve(LrSchedule::Wsd, total, warmup, decay);
  for (int64_t step = warmup - 1; step < total - decay; ++step) EXPECT_EQ(lr[step], kPeak) << step;
  for (int64_t step = total - decay; step < total; ++step)  // each a further sixth of the way down
    EXPECT_NEAR(lr[step], kPeak * (1 - (1 - kFloorRatio) * static_cast<double>(step - (total - decay) + 1) / decay),
                kTol)
        << step;
  // decay_steps = 0: a fifth of the steps after warmup (35 / 5 = 7).
  const std::vector<double> fifth = curve(LrSchedule::Wsd, total, warmup);
  EXPECT_EQ(fifth[total - 8], kPeak);
  EXPECT_LT(fifth[total - 7], kPeak);
  EXPECT_NEAR(fifth.back(), kPeak * kFloorRatio, kTol);
  // More decay steps than follow the warmup: the decay starts right after it.
  EXPECT_EQ(curve(LrSchedule::Wsd, total, warmup, 400), curve(LrSchedule::Wsd, total, warmup, total - warmup));
  EXPECT_LT(curve(LrSchedule::Wsd, total, warmup, 400)[warmup], kPeak);
  // One decay step: the last step is at the floor.
  EXPECT_NEAR(curve(LrSchedule::Wsd, total, warmup, 1).back(), kPeak * kFloorRatio, kTol);
  EXPECT_EQ(curve(LrSchedule::Wsd, total, warmup, 1)[total - 2], kPeak);
}

// The reason for wsd: a run extended (train.steps raised on resume) has had the same rates so far,
// where cosine's would have been another curve.
TEST(LrSchedule, WsdRatesBeforeTheDecayDoNotDependOnTheRunsLength) {
  const std::vector<double> shorter = curve(LrSchedule::Wsd, 100, 10, 20), longer = curve(LrSchedule::Wsd, 300, 10, 20);
  for (int64_t step = 0; step < 80; ++step) EXPECT_EQ(shorter[step], longer[step]) << step;
  const std::vector<double> cos_short = curve(LrSchedule::Cosine, 100, 10), cos_long = curve(LrSchedule::Cosine, 300, 10);
  EXPECT_NE(cos_short[50], cos_long[50]);
}

TEST(LrSchedule, DecayStepsTheScheduleWouldNotUseAreRefusedNamingTheKeys) {
  const auto refused = [](const std::vector<std::string>& sets, const std::vector<std::string>& needles) {
    try {
      load_config("tiny", sets);
      ADD_FAILURE() << "accepted: " << sets.back();
    } catch (const Error& e) {
      for (const std::string& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  };
  refused({"train.decay_steps=10"}, {"train.decay_steps = 10", "train.lr_schedule = \"wsd\""});
  // A long run's wsd config run short (bench, --steps 10) is not refused: its decay covers every
  // step after the warmup instead.
  EXPECT_NO_THROW(load_config("tiny", {"train.lr_schedule=\"wsd\"", "train.steps=10", "train.warmup_steps=3",
                                       "train.decay_steps=400"}));
  EXPECT_EQ(load_config("tiny", {}).train.lr_schedule, LrSchedule::Cosine) << "a config without the key: OLMoE's";
}

// The trainer's steps run at the schedule's rate: a wsd run's records, and the same run extended on
// resume (train.steps 8 -> 12) keeps the peak until its own decay.
TEST(LrSchedule, TheTrainerStepsAtTheSchedulesRateAndAnExtendedWsdRunKeepsThePeak) {
  testing::TempDir dir;
  TrainOptions quiet;
  quiet.quiet = true;
  const std::vector<std::string> wsd = {"train.lr_schedule=\"wsd\"", "train.warmup_steps=2", "train.decay_steps=3",
                                        "train.eval_every=0", "train.eval_batches=0", "train.save_every=4"};
  std::vector<std::string> o = wsd;
  o.push_back("train.steps=8");
  const Config cfg = testing::small_config(dir.path, o);
  const TrainSummary first = Trainer(cfg, quiet, testing::local_world()).run();
  ASSERT_EQ(first.steps.size(), 8u);
  for (int64_t i = 0; i < 8; ++i)
    EXPECT_EQ(first.steps[i].lr, lr_at(i, 8, cfg.train.lr, 2, cfg.train.min_lr_ratio, LrSchedule::Wsd, 3)) << i;
  EXPECT_EQ(first.steps[4].lr, cfg.train.lr);
  EXPECT_LT(first.steps[5].lr, cfg.train.lr) << "the last 3 of 8 steps decay";

  o.back() = "train.steps=12";
  TrainOptions resume = quiet;
  resume.resume = dir.path + "/step-000004";
  const TrainSummary extended = Trainer(testing::small_config(dir.path, o), resume, testing::local_world()).run();
  ASSERT_EQ(extended.steps.size(), 8u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(extended.steps[i].lr, cfg.train.lr) << "step " << 5 + i;
  EXPECT_NEAR(extended.steps.back().lr, cfg.train.lr * cfg.train.min_lr_ratio, 1e-12);
}

}  // namespace
}  // namespace moe

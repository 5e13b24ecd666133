// train.async_save: periodic checkpoints written on a background thread from a host copy.
// - With the writes slowed (test hook) so that later steps train while a checkpoint is written, each
//   checkpoint's rank file and index are byte for byte the foreground run's: the copy is of the
//   saved step, not of the weights the next steps change. The run ends with every checkpoint it
//   started committed, no temp directory left, and one resumes with the uninterrupted losses.
// - A background write that fails (test hook: a full disk) ends the run at a later step boundary
//   with one error naming the checkpoint and the reason; the checkpoints before it stay, the failed
//   one's temp directory goes. A run that gives up on non-finite steps commits the one in flight.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../process_state.h"
#include "moe/core/error.h"
#include "moe/train/trainer.h"
#include "train_test_util.h"

namespace fs = std::filesystem;

namespace moe {
namespace {

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

using moe::testing::ScopedEnv;

TrainOptions quiet() {
  TrainOptions o;
  o.quiet = true;
  return o;
}

TEST(AsyncSave, CheckpointsWrittenWhileTrainingEqualForegroundOnes) {
  testing::TempDir fg_dir, bg_dir;
  const std::vector<std::string> o = {"train.steps=8", "train.save_every=3"};
  std::vector<std::string> bg = o;
  bg.push_back("train.async_save=true");
  TrainSummary fg_run, bg_run;
  {
    Trainer t(testing::small_config(fg_dir.path, o), quiet(), testing::local_world());
    fg_run = t.run();
  }
  {
    const ScopedEnv slow("MOE_TEST_SLOW_BACKGROUND_SAVE", "400");  // several steps train during each write
    Trainer t(testing::small_config(bg_dir.path, bg), quiet(), testing::local_world());
    bg_run = t.run();
  }
  ASSERT_EQ(bg_run.steps.size(), 8u);
  for (size_t i = 0; i < bg_run.steps.size(); ++i)
    EXPECT_EQ(bg_run.steps[i].loss, fg_run.steps[i].loss) << "step " << i + 1;
  const std::string& fg = fg_dir.path;
  const std::string& bg_root = bg_dir.path;
  // Steps 3 and 6 in the background, 8 (the final one) in the foreground after waiting for 6.
  EXPECT_EQ(entries(bg_root), entries(fg));
  for (const char* step : {"step-000003", "step-000006", "step-000008"}) {
    SCOPED_TRACE(step);
    ASSERT_TRUE(fs::is_directory(bg_root + "/" + step));
    EXPECT_EQ(file_bytes(bg_root + "/" + step + "/rank-00000.safetensors"),
              file_bytes(fg + "/" + step + "/rank-00000.safetensors"));
    EXPECT_EQ(file_bytes(bg_root + "/" + step + "/index.json"), file_bytes(fg + "/" + step + "/index.json"));
  }

  // Resumed from the background checkpoint of step 6: the uninterrupted run's last two losses.
  TrainOptions resume = quiet();
  resume.resume = bg_root + "/step-000006";
  Trainer resumed(testing::small_config(bg_dir.path, bg), resume, testing::local_world());
  const TrainSummary tail = resumed.run();
  ASSERT_EQ(tail.steps.size(), 2u);
  EXPECT_EQ(tail.steps[0].loss, fg_run.steps[6].loss);
  EXPECT_EQ(tail.steps[1].loss, fg_run.steps[7].loss);
}

TEST(AsyncSave, AFailedBackgroundWriteEndsTheRunAndKeepsTheCheckpointsBeforeIt) {
  testing::TempDir dir;
  const std::string& run = dir.path;
  {
    Trainer t(testing::small_config(dir.path, {"train.steps=3"}), quiet(), testing::local_world());
    t.run();
  }
  ASSERT_TRUE(fs::is_directory(run + "/step-000003"));
  const std::string before = file_bytes(run + "/step-000003/rank-00000.safetensors");

  const ScopedEnv full("MOE_TEST_FAIL_BACKGROUND_SAVE", "1");
  TrainOptions resume = quiet();
  resume.resume = "latest";
  Trainer t(testing::small_config(dir.path, {"train.steps=40", "train.save_every=5", "train.async_save=true"}), resume,
            testing::local_world());
  try {
    t.run();
    ADD_FAILURE() << "the run went on past a failed background save";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("checkpoint step-000005 was not saved: rank 0's file, written in the background "
                        "(train.async_save), failed"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("No space left on device (test hook)"), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(run + "/step-000005"));
  // The step boundaries after the save found the failure and ended the run long before its last
  // step (40 steps: a loaded machine may start the background writer late).
  EXPECT_FALSE(fs::exists(run + "/step-000040"));
  std::ifstream metrics(run + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(metrics, line))
    if (!line.empty()) last = line;
  const size_t at = last.find("\"step\":");
  ASSERT_NE(at, std::string::npos) << last;
  const int64_t last_step = std::stoll(last.substr(at + 7));
  EXPECT_GE(last_step, 5);
  // At the latest the next save (step 10) waits for the failed one and ends the run.
  EXPECT_LE(last_step, 10) << "the run trained on past a failed save";
  for (const std::string& name : entries(run)) EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
  EXPECT_EQ(file_bytes(run + "/step-000003/rank-00000.safetensors"), before);
}

// A run that gives up on non-finite steps tells the user to resume from an earlier checkpoint: one
// still being written in the background is committed before that error (it was dropped, its rank
// file left in the temp folder for the next start to delete).
TEST(AsyncSave, ADivergedRunCommitsTheCheckpointItPointsTo) {
  testing::TempDir dir;
  const ScopedEnv slow("MOE_TEST_SLOW_BACKGROUND_SAVE", "500");
  const ScopedEnv nonfinite("MOE_TEST_NONFINITE_FROM_STEP", "3");  // steps 3 on have non-finite gradients
  Trainer t(testing::small_config(dir.path, {"train.steps=8", "train.save_every=2", "train.async_save=true",
                                             "train.max_skipped_steps=2"}),
            quiet(), testing::local_world());
  try {
    t.run();
    ADD_FAILURE() << "the run did not give up";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the model has diverged"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_directory(dir.path + "/step-000002"));
  for (const std::string& name : entries(dir.path)) EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
}

// Any other error while a checkpoint is written in the background: in one process the checkpoint is
// still committed before the error leaves run() (no other rank takes part in the commit).
TEST(AsyncSave, AnErrorInALaterStepStillCommitsTheCheckpointInOneProcess) {
  testing::TempDir dir;
  const ScopedEnv slow("MOE_TEST_SLOW_BACKGROUND_SAVE", "500");
  const ScopedEnv fail("MOE_TEST_FAIL_ON_RANK", "0");  // rank 0 throws in its second step
  Trainer t(testing::small_config(dir.path, {"train.steps=8", "train.save_every=1", "train.async_save=true"}), quiet(),
            testing::local_world());
  EXPECT_THROW(t.run(), Error);
  EXPECT_TRUE(fs::is_directory(dir.path + "/step-000001"));
  for (const std::string& name : entries(dir.path)) EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
}

}  // namespace
}  // namespace moe

// BackgroundRankFile (train.async_save's writer): the file written on its thread is the one
// write_rank_file writes in the foreground from the slices as they were at start(), even when the
// caller's memory changes before the thread writes (the write is held back by a test hook, so the
// change lands first); slices produced on demand are copied at start() too; the next write reuses
// the kept host copy when its slices have the same sizes; a failed write comes
// back from finish() as the error, and finish() without a write is refused.
#include "moe/ckpt/background_rank_file.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../process_state.h"
#include "moe/core/error.h"
#include "temp_dir.h"

namespace moe {
namespace {

using moe::testing::TempDir;

using moe::testing::ScopedEnv;

// Two slices of one 64-element tensor: the first held in `host`, the second produced on demand.
std::vector<CheckpointSlice> slices_over(const std::vector<float>& host) {
  return {{"w", DType::F32, {64}, 0, 40, host.data()}, {"w", DType::F32, {64}, 40, 64, nullptr}};
}

void produce_tail(size_t index, void* dst) {
  ASSERT_EQ(index, 1u);
  float* out = static_cast<float*>(dst);
  for (int i = 0; i < 24; ++i) out[i] = 1000.0f + static_cast<float>(i);
}

TEST(BackgroundRankFile, WritesTheSlicesAsTheyWereAtStart) {
  TempDir fg, bg;
  std::vector<float> host(40);
  std::iota(host.begin(), host.end(), 1.0f);
  write_rank_file(fg.path, 3, slices_over(host), produce_tail);

  BackgroundRankFile writer;
  writer.pin_for_gpu(true);  // without a usable GPU the copy stays pageable; the file is the same
  EXPECT_EQ(BackgroundRankFile::snapshot_bytes(slices_over(host)), 64u * sizeof(float));
  {
    const ScopedEnv slow("MOE_TEST_SLOW_BACKGROUND_SAVE", "300");
    writer.start(bg.path, 3, slices_over(host), produce_tail);
    ASSERT_TRUE(writer.held());
    EXPECT_FALSE(writer.done());                 // held back 300 ms
    std::fill(host.begin(), host.end(), -7.0f);  // the next training step, before the thread writes
  }
  while (!writer.done()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const std::vector<CheckpointChunk> chunks = writer.finish();
  EXPECT_FALSE(writer.held());
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].file, "rank-00003.safetensors");
  EXPECT_TRUE(chunks[0].checksum.has_value());
  EXPECT_EQ(moe::testing::read_bytes(bg.path + "/rank-00003.safetensors"),
            moe::testing::read_bytes(fg.path + "/rank-00003.safetensors"));

  // The writer takes the next checkpoint once the last is collected, into the buffers it kept
  // (nothing allocated), and the file holds the new values, not the kept ones.
  EXPECT_EQ(writer.kept_bytes(), 64u * sizeof(float));
  EXPECT_EQ(writer.bytes_to_allocate(slices_over(host)), 0u);
  EXPECT_EQ(writer.copies_made(), 1);
  TempDir next, next_fg;
  writer.start(next.path, 3, slices_over(host), produce_tail);
  EXPECT_EQ(writer.kept_bytes(), 0u);  // lent to the write in flight
  EXPECT_EQ(writer.finish().size(), 2u);
  EXPECT_EQ(writer.copies_made(), 1) << "the second write made a new copy instead of reusing the kept one";
  write_rank_file(next_fg.path, 3, slices_over(host), produce_tail);
  EXPECT_EQ(moe::testing::read_bytes(next.path + "/rank-00003.safetensors"),
            moe::testing::read_bytes(next_fg.path + "/rank-00003.safetensors"));

  // Slices of other sizes do not fit the kept copy: a new one is made (the kept one freed first,
  // so a smaller copy adds nothing and a larger one adds the difference), and kept.
  const std::vector<CheckpointSlice> other = {{"w", DType::F32, {64}, 0, 40, host.data()}};
  EXPECT_EQ(writer.bytes_to_allocate(other), 0u);
  TempDir third;
  writer.start(third.path, 3, other, nullptr);
  EXPECT_EQ(writer.finish().size(), 1u);
  EXPECT_EQ(writer.copies_made(), 2);
  EXPECT_EQ(writer.kept_bytes(), 40u * sizeof(float));
  EXPECT_EQ(writer.bytes_to_allocate(slices_over(host)), 24u * sizeof(float));
}

TEST(BackgroundRankFile, AFailedWriteComesBackFromFinish) {
  TempDir dir;
  std::vector<float> host(40, 1.0f);
  BackgroundRankFile writer;
  {
    const ScopedEnv full("MOE_TEST_FAIL_BACKGROUND_SAVE", "1");
    writer.start(dir.path, 0, slices_over(host), produce_tail);
  }
  try {
    writer.finish();
    ADD_FAILURE() << "a failed write returned chunk records";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("No space left on device (test hook)"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(writer.held());
  try {
    writer.finish();
    ADD_FAILURE() << "finish() without a write was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("finish() without a write"), std::string::npos) << e.what();
  }
}

// Destroyed while an exception unwinds (an error on one rank of a job, on its way to MPI_Abort),
// the writer does not wait for the disk: the thread, owning its copy, is left to end on its own.
// Destroyed otherwise, it waits.
TEST(BackgroundRankFile, DestructionDuringAnErrorDoesNotWaitForTheDisk) {
  TempDir dir;
  std::vector<float> host(40, 2.0f);
  const ScopedEnv slow("MOE_TEST_SLOW_BACKGROUND_SAVE", "1500");
  const auto t0 = std::chrono::steady_clock::now();
  try {
    BackgroundRankFile writer;
    writer.start(dir.path, 0, slices_over(host), produce_tail);
    throw std::runtime_error("a failing step");
  } catch (const std::runtime_error&) {
  }
  const double unwound_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(unwound_s, 1.0) << "the destructor waited for the write";
  {
    BackgroundRankFile writer;
    writer.start(dir.path, 1, slices_over(host), produce_tail);
  }
  const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited_s, 1.5) << "the destructor did not wait for the write";
  EXPECT_TRUE(std::filesystem::exists(dir.path + "/rank-00001.safetensors"));
}

}  // namespace
}  // namespace moe

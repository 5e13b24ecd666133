// RunLock against the other holders a run directory's .lock can have: a probe's shared lock held
// for an instant (run_lock_holder, wandb_sidecar.py --follow) is waited out, a job's exclusive
// lock is refused after kBusyFor, naming the holder. (The CLI tests cover stale and corrupt files.)
#include "moe/train/run_lock.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

namespace moe {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

class RunLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("moe-run-lock-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    path_ = (dir_ / ".lock").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Another open file description of the lock file, holding `op` (LOCK_SH or LOCK_EX): flock
  // conflicts between descriptions even in one process, as between a probe and a job.
  int hold(int op) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT, 0644);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::flock(fd, op | LOCK_NB), 0);
    return fd;
  }

  fs::path dir_;
  std::string path_;
};

TEST_F(RunLockTest, AProbesSharedLockHeldAtTheStartIsWaitedOut) {
  const int probe = hold(LOCK_SH);
  std::atomic<bool> taken{false};
  std::optional<RunLock> lock;
  std::string error;
  std::thread start([&] {
    try {
      lock.emplace(path_);
    } catch (const std::exception& e) {
      error = e.what();
    }
    taken = true;
  });
  // The start asks while the probe holds its shared lock: it must still be asking, not refused.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  static_assert(std::chrono::milliseconds(100) < kBusyFor);
  EXPECT_FALSE(taken) << "the start did not wait for the probe: " << error;
  ::close(probe);
  start.join();
  EXPECT_EQ(error, "");
  ASSERT_TRUE(lock.has_value());
  EXPECT_EQ(run_lock_holder(path_).rfind("process " + std::to_string(::getpid()), 0), 0u) << run_lock_holder(path_);
  lock.reset();
  EXPECT_FALSE(fs::exists(path_));  // removed at the end
}

TEST_F(RunLockTest, AJobsExclusiveLockIsRefusedAfterTheWaitNamingTheFile) {
  {
    std::ofstream(path_) << "{\"pid\": 4242, \"host\": \"elsewhere\", \"started\": \"20260101-000000\"}\n";
  }
  const int job = hold(LOCK_EX);
  const auto start = Clock::now();
  try {
    RunLock lock(path_);
    ADD_FAILURE() << "a held lock was taken";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("in use by process 4242 on host elsewhere"), std::string::npos) << what;
    EXPECT_NE(what.find(path_), std::string::npos) << what;
  }
  EXPECT_GE(Clock::now() - start, kBusyFor);
  ::close(job);
}

}  // namespace
}  // namespace moe

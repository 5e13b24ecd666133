#include "moe/ckpt/background_rank_file.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <utility>

#include "moe/core/error.h"

namespace moe {

namespace {

// The signals a user or a launcher sends to stop or save a run: the trainer's handlers
// (train/stop_request.h) run on the main thread, which also polls the flags they set. The writer
// thread starts with them blocked, so it is never the thread the kernel picks to deliver them.
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT, SIGALRM}) sigaddset(&set, s);
  return set;
}

}  // namespace

BackgroundRankFile::~BackgroundRankFile() {
  if (thread_.joinable()) thread_.join();
}

size_t BackgroundRankFile::snapshot_bytes(const std::vector<CheckpointSlice>& slices) {
  size_t bytes = 0;
  for (const CheckpointSlice& s : slices) bytes += static_cast<size_t>(s.end - s.begin) * dtype_size(s.dtype);
  return bytes;
}

void BackgroundRankFile::start(const std::string& tmp_dir, int rank, std::vector<CheckpointSlice> slices,
                               const SliceProducer& produce) {
  MOE_CHECK(!held(), "BackgroundRankFile: a checkpoint write is still held; finish() it before the next");
  storage_.assign(slices.size(), {});
  for (size_t i = 0; i < slices.size(); ++i) {
    CheckpointSlice& s = slices[i];
    const size_t bytes = static_cast<size_t>(s.end - s.begin) * dtype_size(s.dtype);
    storage_[i].resize(bytes);
    if (bytes == 0) continue;
    if (s.data != nullptr) {
      std::copy_n(static_cast<const unsigned char*>(s.data), bytes, storage_[i].data());
    } else {
      MOE_CHECK(produce != nullptr, "BackgroundRankFile: slice '", s.key, "' has neither data nor a producer");
      produce(i, storage_[i].data());
    }
    s.data = storage_[i].data();
  }
  done_.store(false, std::memory_order_release);
  chunks_.clear();
  error_ = nullptr;
  // Test hooks, read here (getenv is not safe beside a setenv on another thread): a slow disk, so
  // that the steps after the save run while it is written, and a full one.
  const char* slow = std::getenv("MOE_TEST_SLOW_BACKGROUND_SAVE");
  const int delay_ms = slow != nullptr ? std::atoi(slow) : 0;
  const bool fail = std::getenv("MOE_TEST_FAIL_BACKGROUND_SAVE") != nullptr;
  const sigset_t blocked = stop_signals();
  sigset_t previous;
  pthread_sigmask(SIG_BLOCK, &blocked, &previous);  // inherited by the thread, restored here below
  thread_ = std::thread([this, tmp_dir, rank, slices = std::move(slices), delay_ms, fail] {
    try {
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      if (fail) MOE_FAIL("cannot write ", tmp_dir, "/", rank_file_name(rank), ": No space left on device (test hook)");
      chunks_ = write_rank_file(tmp_dir, rank, slices);
    } catch (...) {
      error_ = std::current_exception();
    }
    done_.store(true, std::memory_order_release);
  });
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

std::vector<CheckpointChunk> BackgroundRankFile::finish() {
  MOE_CHECK(held(), "BackgroundRankFile: finish() without a write");
  thread_.join();
  storage_.clear();
  storage_.shrink_to_fit();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return std::move(chunks_);
}

}  // namespace moe

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

// Signals sent to the process rather than raised by a write: those a user or a launcher sends to
// stop a run (the trainer's handlers, train/stop_request.h, set flags the main thread polls) and
// the others a process is commonly sent. The writer thread starts with them blocked, so the kernel
// always delivers them to a thread that may act on them.
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT, SIGALRM}) sigaddset(&set, s);
  return set;
}

}  // namespace

BackgroundRankFile::~BackgroundRankFile() {
  if (!thread_.joinable()) return;
  if (std::uncaught_exceptions() > 0)
    thread_.detach();
  else
    thread_.join();
}

bool BackgroundRankFile::done() const { return write_ != nullptr && write_->done.load(std::memory_order_acquire); }

size_t BackgroundRankFile::snapshot_bytes(const std::vector<CheckpointSlice>& slices) {
  size_t bytes = 0;
  for (const CheckpointSlice& s : slices) bytes += static_cast<size_t>(s.end - s.begin) * dtype_size(s.dtype);
  return bytes;
}

void BackgroundRankFile::start(const std::string& tmp_dir, int rank, std::vector<CheckpointSlice> slices,
                               const SliceProducer& produce) {
  MOE_CHECK(!held(), "BackgroundRankFile: a checkpoint write is still held; finish() it before the next");
  auto write = std::make_shared<Write>();
  write->storage.reserve(slices.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    CheckpointSlice& s = slices[i];
    const size_t bytes = static_cast<size_t>(s.end - s.begin) * dtype_size(s.dtype);
    // Not zero-filled first: the copy is the pause training sees, and a fill would add a pass.
    write->storage.emplace_back(new unsigned char[std::max<size_t>(bytes, 1)]);
    unsigned char* copy = write->storage.back().get();
    if (bytes != 0 && s.data != nullptr) {
      std::copy_n(static_cast<const unsigned char*>(s.data), bytes, copy);
    } else if (bytes != 0) {
      MOE_CHECK(produce != nullptr, "BackgroundRankFile: slice '", s.key, "' has neither data nor a producer");
      produce(i, copy);
    }
    s.data = copy;
  }
  // Test hooks, read here (getenv is not safe beside a setenv on another thread): a slow disk, so
  // that the steps after the save run while it is written, and a full one.
  const char* slow = std::getenv("MOE_TEST_SLOW_BACKGROUND_SAVE");
  const int delay_ms = slow != nullptr ? std::atoi(slow) : 0;
  const bool fail = std::getenv("MOE_TEST_FAIL_BACKGROUND_SAVE") != nullptr;
  const sigset_t blocked = stop_signals();
  sigset_t previous;
  pthread_sigmask(SIG_BLOCK, &blocked, &previous);  // inherited by the thread
  struct RestoreMask {                              // also when the thread cannot be started
    const sigset_t& mask;
    ~RestoreMask() { pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{previous};
  thread_ = std::thread([write, tmp_dir, rank, slices = std::move(slices), delay_ms, fail] {
    try {
      if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      if (fail) MOE_FAIL("cannot write ", tmp_dir, "/", rank_file_name(rank), ": No space left on device (test hook)");
      write->chunks = write_rank_file(tmp_dir, rank, slices);
    } catch (...) {
      write->error = std::current_exception();
    }
    write->done.store(true, std::memory_order_release);
  });
  write_ = std::move(write);
}

std::vector<CheckpointChunk> BackgroundRankFile::finish() {
  MOE_CHECK(held(), "BackgroundRankFile: finish() without a write");
  thread_.join();
  const std::shared_ptr<Write> write = std::move(write_);  // the host copy is freed on return
  if (write->error) std::rethrow_exception(write->error);
  return std::move(write->chunks);
}

}  // namespace moe

#include "moe/ckpt/background_rank_file.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "moe/core/arena.h"
#include "moe/core/error.h"
#include "moe/core/pinned_host.h"

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

size_t slice_bytes(const CheckpointSlice& s) { return static_cast<size_t>(s.end - s.begin) * dtype_size(s.dtype); }

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
  for (const CheckpointSlice& s : slices) bytes += slice_bytes(s);
  return bytes;
}

BackgroundRankFile::Snapshot::Snapshot(const std::vector<CheckpointSlice>& slices, bool pin) {
  size_t total = 0;
  for (const CheckpointSlice& s : slices) {
    offsets.push_back(total);
    sizes.push_back(slice_bytes(s));
    total += (sizes.back() + 63) / 64 * 64;  // each copy on its own cache lines
  }
  mapped = std::max<size_t>(total, 1);
  // Not zero-filled by a pass of ours: the kernel's fresh pages are, and the copy overwrites them.
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;  // before anything else can set it
    MOE_FAIL("train.async_save: cannot map ", format_bytes(static_cast<double>(mapped)),
             " of host memory for the checkpoint's copy: ", std::strerror(err));
  }
  base = static_cast<unsigned char*>(p);
  pinned = pin && pin_host_memory(base, mapped);
}

BackgroundRankFile::Snapshot::~Snapshot() {
  if (pinned) unpin_host_memory(base);
  munmap(base, mapped);
}

bool BackgroundRankFile::Snapshot::fits(const std::vector<CheckpointSlice>& slices) const {
  if (sizes.size() != slices.size()) return false;
  for (size_t i = 0; i < slices.size(); ++i)
    if (sizes[i] != slice_bytes(slices[i])) return false;
  return true;
}

size_t BackgroundRankFile::Snapshot::bytes() const {
  size_t total = 0;
  for (size_t b : sizes) total += b;
  return total;
}

size_t BackgroundRankFile::bytes_to_allocate(const std::vector<CheckpointSlice>& slices) const {
  if (kept_ && kept_->fits(slices)) return 0;
  const size_t bytes = snapshot_bytes(slices), kept = kept_bytes();
  return bytes > kept ? bytes - kept : 0;
}

size_t BackgroundRankFile::kept_bytes() const { return kept_ ? kept_->bytes() : 0; }

void BackgroundRankFile::start(const std::string& tmp_dir, int rank, std::vector<CheckpointSlice> slices,
                               const SliceProducer& produce) {
  MOE_CHECK(!held(), "BackgroundRankFile: a checkpoint write is still held; finish() it before the next");
  auto write = std::make_shared<Write>();
  if (kept_ && kept_->fits(slices)) {
    write->snapshot = std::move(kept_);
  } else {
    kept_.reset();  // unmapped before the new one is mapped
    write->snapshot = std::make_unique<Snapshot>(slices, pin_);
    ++copies_made_;
  }
  for (size_t i = 0; i < slices.size(); ++i) {
    CheckpointSlice& s = slices[i];
    const size_t bytes = write->snapshot->sizes[i];
    unsigned char* copy = write->snapshot->base + write->snapshot->offsets[i];
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
  const std::shared_ptr<Write> write = std::move(write_);
  kept_ = std::move(write->snapshot);  // the thread has ended: the next start() copies into it
  if (write->error) std::rethrow_exception(write->error);
  return std::move(write->chunks);
}

}  // namespace moe

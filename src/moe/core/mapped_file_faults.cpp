#include "moe/core/mapped_file_faults.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "moe/core/signal_safe_write.h"

namespace moe {

namespace {

// Only async-signal-safe work in the handler: the table is fixed, its fields atomics or
// character arrays written before the slot is published.
enum SlotState : int { kFree = 0, kFilling = 1, kLive = 2 };
struct Slot {
  std::atomic<int> state{kFree};
  std::atomic<uintptr_t> begin{0}, end{0};
  char path[256] = {};
  char advice[160] = {};
};
constexpr int kSlots = 4096;
Slot g_slots[kSlots];
std::atomic<bool> g_any_unnamed{false};  // a mapping went unrecorded: the table was full
struct sigaction g_previous {};

extern "C" void report_mapped_file_fault(int sig, siginfo_t* info, void* context) {
  // A fault has a positive si_code and its address; a SIGBUS sent by kill or raise has neither.
  const bool fault = info != nullptr && info->si_code > 0;
  const auto at = fault ? reinterpret_cast<uintptr_t>(info->si_addr) : 0;
  for (Slot& s : g_slots) {
    if (!fault) break;
    if (s.state.load(std::memory_order_acquire) != kLive) continue;
    if (at < s.begin.load() || at >= s.end.load()) continue;
    write_stderr_signal_safe("error: ");
    write_stderr_signal_safe(s.path);
    write_stderr_signal_safe(" could not be read (SIGBUS): it was truncated or replaced while moetrain read it; ");
    write_stderr_signal_safe(s.advice);
    write_stderr_signal_safe("\n");
    ::_exit(1);
  }
  if (fault && g_any_unnamed.load()) {
    write_stderr_signal_safe(
        "error: a memory-mapped file could not be read (SIGBUS): a token, checkpoint or weights file was "
        "probably truncated or replaced while moetrain read it; restore it and run again\n");
    ::_exit(1);
  }
  // Not ours: whoever handled SIGBUS before, as if we were not here.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  // The default action, once this handler returns: SIGBUS is blocked in here, so the raised one
  // waits until then (and a fault's instruction would fault again anyway).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGBUS, &dfl, nullptr);
  raise(SIGBUS);
}

void install_once() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = report_mapped_file_fault;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGBUS, &sa, &g_previous);
    return true;
  }();
  (void)installed;
}

void copy_text(char* dst, size_t size, const char* src) {
  std::strncpy(dst, src, size - 1);
  dst[size - 1] = '\0';
}

}  // namespace

void watch_mapping(const void* p, size_t bytes, const std::string& path, const char* advice) {
  install_once();
  for (Slot& s : g_slots) {
    int expected = kFree;
    if (!s.state.compare_exchange_strong(expected, kFilling, std::memory_order_acq_rel)) continue;
    copy_text(s.path, sizeof s.path, path.c_str());
    copy_text(s.advice, sizeof s.advice, advice);
    s.begin = reinterpret_cast<uintptr_t>(p);
    s.end = reinterpret_cast<uintptr_t>(p) + bytes;
    s.state.store(kLive, std::memory_order_release);
    return;
  }
  g_any_unnamed = true;
}

void unwatch_mapping(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  for (Slot& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) != kLive || s.begin.load() != at) continue;
    int expected = kLive;
    if (!s.state.compare_exchange_strong(expected, kFilling, std::memory_order_acq_rel)) continue;
    s.begin = 0;
    s.end = 0;
    s.state.store(kFree, std::memory_order_release);
    return;
  }
}

}  // namespace moe

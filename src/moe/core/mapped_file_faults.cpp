#include "moe/core/mapped_file_faults.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "moe/core/signal_safe_write.h"

namespace moe {

namespace {

// Only async-signal-safe work in the handler: the table is fixed, its fields atomics or
// character arrays written before the slot is published. A slot's generation changes each time it
// is filled, so a handler that read it while another thread reused it sees the change and skips it.
enum SlotState : int { kFree = 0, kFilling = 1, kLive = 2 };
struct Slot {
  std::atomic<int> state{kFree};
  std::atomic<uint32_t> generation{0};
  std::atomic<uintptr_t> begin{0}, end{0};
  char path[256] = {};
  char advice[160] = {};
};
constexpr int kSlots = 4096;
Slot g_slots[kSlots];
// Mappings past the table (thousands of token shards): how many are live and the span they lie in,
// so that a fault there is still reported, without the file's name, and any other SIGBUS is not.
std::atomic<int64_t> g_unnamed{0};
std::atomic<uintptr_t> g_unnamed_lo{UINTPTR_MAX}, g_unnamed_hi{0};
struct sigaction g_previous {};

void reset_to_default() {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGBUS, &dfl, nullptr);
}

// The default action, once this handler returns: SIGBUS is blocked in here, so the raised one
// waits until then (and a fault's instruction would fault again anyway).
void die_of_sigbus() {
  reset_to_default();
  raise(SIGBUS);
}

// Whoever handled SIGBUS before, as if this handler were not there.
void pass_on(int sig, siginfo_t* info, void* context, bool fault) {
  const struct sigaction prev = g_previous;
  // SIG_IGN and SIG_DFL are handler values whatever the flags say (the kernel keeps SA_SIGINFO).
  if (prev.sa_handler == SIG_IGN) {
    if (!fault) return;  // a sent SIGBUS stays ignored; an ignored fault would repeat for ever
    return die_of_sigbus();
  }
  if (prev.sa_handler == SIG_DFL) return die_of_sigbus();
  if ((prev.sa_flags & SA_RESETHAND) != 0) reset_to_default();
  if ((prev.sa_flags & SA_SIGINFO) != 0)
    prev.sa_sigaction(sig, info, context);
  else
    prev.sa_handler(sig);
}

extern "C" void report_mapped_file_fault(int sig, siginfo_t* info, void* context) {
  // A fault has a positive si_code and its address; a SIGBUS sent by kill or raise has neither.
  const bool fault = info != nullptr && info->si_code > 0;
  const auto at = fault ? reinterpret_cast<uintptr_t>(info->si_addr) : 0;
  for (Slot& s : g_slots) {
    if (!fault) break;
    const uint32_t generation = s.generation.load(std::memory_order_acquire);
    if (s.state.load(std::memory_order_acquire) != kLive) continue;
    if (at < s.begin.load() || at >= s.end.load()) continue;
    char path[sizeof s.path], advice[sizeof s.advice];
    std::memcpy(path, s.path, sizeof path);
    std::memcpy(advice, s.advice, sizeof advice);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.state.load() != kLive || s.generation.load() != generation) continue;  // reused meanwhile
    path[sizeof path - 1] = advice[sizeof advice - 1] = '\0';
    write_stderr_signal_safe("error: ");
    write_stderr_signal_safe(path);
    write_stderr_signal_safe(" could not be read (SIGBUS): it was truncated or replaced while moetrain read it; ");
    write_stderr_signal_safe(advice);
    write_stderr_signal_safe("\n");
    ::_exit(1);
  }
  if (fault && g_unnamed.load() > 0 && at >= g_unnamed_lo.load() && at < g_unnamed_hi.load()) {
    write_stderr_signal_safe(
        "error: a memory-mapped file could not be read (SIGBUS): a token, checkpoint or weights file was "
        "probably truncated or replaced while moetrain read it; restore it and run again\n");
    ::_exit(1);
  }
  pass_on(sig, info, context, fault);
}

void install_once() {
  static const bool installed = [] {
    // The previous action is read before ours replaces it: a SIGBUS on another thread meanwhile
    // already finds it.
    sigaction(SIGBUS, nullptr, &g_previous);
    struct sigaction sa {};
    sa.sa_sigaction = report_mapped_file_fault;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGBUS, &sa, nullptr);
    return true;
  }();
  (void)installed;
}

void copy_text(char* dst, size_t size, const char* src) {
  std::strncpy(dst, src, size - 1);
  dst[size - 1] = '\0';
}

void widen_unnamed_span(uintptr_t lo, uintptr_t hi) {
  uintptr_t cur = g_unnamed_lo.load();
  while (lo < cur && !g_unnamed_lo.compare_exchange_weak(cur, lo)) {
  }
  cur = g_unnamed_hi.load();
  while (hi > cur && !g_unnamed_hi.compare_exchange_weak(cur, hi)) {
  }
}

}  // namespace

void watch_mapping(const void* p, size_t bytes, const std::string& path, const char* advice) {
  install_once();
  const auto begin = reinterpret_cast<uintptr_t>(p);
  for (Slot& s : g_slots) {
    int expected = kFree;
    if (!s.state.compare_exchange_strong(expected, kFilling, std::memory_order_acq_rel)) continue;
    s.generation.fetch_add(1, std::memory_order_acq_rel);
    copy_text(s.path, sizeof s.path, path.c_str());
    copy_text(s.advice, sizeof s.advice, advice);
    s.begin = begin;
    s.end = begin + bytes;
    s.state.store(kLive, std::memory_order_release);
    return;
  }
  // The span only grows while unnamed mappings live (it may then cover others' memory too: a fault
  // there is reported as a file's); it is reset when the last of them is unwatched.
  widen_unnamed_span(begin, begin + bytes);
  g_unnamed.fetch_add(1);
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
  // Not in the table: one of the unnamed mappings.
  if (g_unnamed.load() > 0 && g_unnamed.fetch_sub(1) == 1) {
    g_unnamed_lo = UINTPTR_MAX;
    g_unnamed_hi = 0;
  }
}

}  // namespace moe

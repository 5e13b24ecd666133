#include "moe/core/interrupt_guard.h"

#include <unistd.h>

#include <exception>
#include <utility>

namespace moe {

namespace {

volatile std::sig_atomic_t g_interrupt = 0;  // the first signal since the guard was made

extern "C" void record_interrupt(int signo) {
  if (g_interrupt == 0) g_interrupt = signo;
}

const char* interrupt_name(int signo) {
  return signo == SIGINT ? "SIGINT" : signo == SIGTERM ? "SIGTERM" : signo == SIGHUP ? "SIGHUP" : "a signal";
}

}  // namespace

InterruptGuard::InterruptGuard(std::string command) : command_(std::move(command)) {
  g_interrupt = 0;
  struct sigaction sa {};
  sa.sa_handler = record_interrupt;
  sa.sa_flags = SA_RESTART;  // the writes in flight finish; the next check() stops
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    struct sigaction old {};
    sigaction(kSignals[i], nullptr, &old);
    installed_[i] = old.sa_handler != SIG_IGN;
    if (installed_[i]) sigaction(kSignals[i], &sa, &previous_[i]);
  }
}

InterruptGuard::~InterruptGuard() {
  for (size_t i = 0; i < std::size(kSignals); ++i)
    if (installed_[i]) sigaction(kSignals[i], &previous_[i], nullptr);
  // A signal after the last check: the output is complete; the previous handler has its turn
  // (by default: the process dies of it). While an error unwinds, that error is what is reported.
  const int pending = g_interrupt;
  g_interrupt = 0;
  if (pending != 0 && !reported_ && std::uncaught_exceptions() == 0) ::raise(pending);
}

void InterruptGuard::check(const std::string& undone) {
  const int signo = g_interrupt;
  if (signo == 0) return;
  reported_ = true;
  throw Interrupted(command_ + " was interrupted (" + interrupt_name(signo) + "); " + undone, signo);
}

void die_of_signal(int signo) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(signo, &dfl, nullptr);
  sigset_t unblock;
  sigemptyset(&unblock);
  sigaddset(&unblock, signo);
  sigprocmask(SIG_UNBLOCK, &unblock, nullptr);
  ::raise(signo);
  ::_exit(128 + signo);  // a signal whose default action is not to die
}

}  // namespace moe

// Stopping a command that assembles a user's output under a temporary name (export-hf,
// import-hf) on Ctrl-C, SIGTERM or SIGHUP without leaving that temporary behind. While an
// InterruptGuard lives, those signals are recorded instead of ending the process; the writer
// calls check() between tensors, which throws Interrupted, so the temporaries are removed by
// the same unwinding that removes them after any error; the command line then prints the error
// and dies of the signal (die_of_signal), so a calling shell or script sees the interruption as
// such (128 + the signal number), as after `prepare`.
//
// NOTES: prepare removes its temporary files inside the handler (data/prepare_outputs.h), since
// one of its inputs may take the whole run. An export or import moves one tensor at a time, so
// a check between tensors stops within one tensor's time (about a second for OLMoE's largest),
// and its temporaries are folder trees, which a handler could not walk with async-signal-safe
// calls. A signal ignored when the guard is made (nohup, a shell script's background job) stays
// ignored; the previous handlers are back when the guard goes. A signal that comes after the
// last check, once the output is complete, is raised again then, for the previous handler.
#pragma once

#include <csignal>
#include <iterator>
#include <string>

#include "moe/core/error.h"

namespace moe {

// Thrown by InterruptGuard::check(): the message says what was removed; signal() is the signal.
class Interrupted : public Error {
 public:
  Interrupted(const std::string& what, int signo) : Error(what), signo_(signo) {}
  int signal() const { return signo_; }

 private:
  int signo_;
};

class InterruptGuard {
 public:
  explicit InterruptGuard(std::string command);  // "export-hf": starts the message
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

  // Throws Interrupted ("<command> was interrupted (SIGINT); <undone>") when one of the signals
  // came since the guard was made. `undone` says what the unwinding removes and what is left as
  // it was.
  void check(const std::string& undone);

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
  std::string command_;
  bool reported_ = false;
  bool installed_[std::size(kSignals)] = {};
  struct sigaction previous_[std::size(kSignals)] = {};
};

// Dies of `signo` with its default action (128 + signo for a calling shell); never returns. Only
// async-signal-safe calls (sigaction, sigprocmask, raise, _exit): signal handlers call it too.
[[noreturn]] void die_of_signal(int signo);

}  // namespace moe

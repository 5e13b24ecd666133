#include "moe/train/stop_request.h"

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <initializer_list>

namespace moe {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

constexpr char kFirstInterrupt[] =
    "\nmoetrain: stopping after this step and saving a checkpoint; Ctrl-C again stops at once, without one\n";

extern "C" void record_stop(int signo) {
  if (g_stop_signal == 0) g_stop_signal = signo;
  // A second Ctrl-C is an emergency stop: back to the default action for the next one. The user
  // is told so now (write is async-signal-safe; its result does not matter here).
  if (signo == SIGINT) {
    std::signal(SIGINT, SIG_DFL);
    [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, kFirstInterrupt, sizeof(kFirstInterrupt) - 1);
  }
}

}  // namespace

void install_stop_handlers() {
  // Once per process: `moetrain train` installs them before building the trainer and run() again;
  // a second install would re-arm the SIGINT that a first Ctrl-C set back to its default action.
  static bool installed = false;
  if (installed) return;
  installed = true;
  struct sigaction sa {};
  sa.sa_handler = record_stop;
  sigemptyset(&sa.sa_mask);
  // Under mpirun a SIGTERM comes with mpirun no longer reading the ranks' output: rank 0 may then
  // be blocked writing a progress line to a full pipe, and a restarted write would keep it there
  // past mpirun's kill, the stop's checkpoint unwritten. There SIGTERM interrupts the write (the
  // line is lost; Trainer::say holds the rest back until the checkpoint is saved). Elsewhere, and
  // for the other signals, calls restart: the files and libraries retry EINTR, but a terminal
  // shared with the shell needs no such help.
  const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
                            std::getenv("PMI_RANK") != nullptr;
  for (int signo : {SIGTERM, SIGUSR1, SIGHUP, SIGINT}) {
    sa.sa_flags = signo == SIGTERM && under_mpirun ? 0 : SA_RESTART;
    // An ignored SIGHUP stays ignored: `nohup moetrain train` must outlive its terminal, not stop
    // when it closes. (The others are caught even when ignored: a shell script's background job
    // starts with SIGINT ignored, and `kill -INT` is still meant to stop it.)
    struct sigaction current {};
    if (signo == SIGHUP && sigaction(signo, nullptr, &current) == 0 && current.sa_handler == SIG_IGN) continue;
    sigaction(signo, &sa, nullptr);
  }
}

int stop_signal() { return g_stop_signal; }

const char* signal_name(int signo) {
  switch (signo) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

}  // namespace moe

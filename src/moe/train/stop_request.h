// Clean stops: schedulers send SIGTERM (or SIGUSR1, with Slurm's --signal) shortly before they
// preempt a job, a closed terminal sends SIGHUP, and a user presses Ctrl-C. `moetrain train`
// installs the handlers before it reads its data and checkpoint (which can take minutes), so a
// signal during start-up stops the run at its first step boundary, with a checkpoint, instead of
// killing it; the trainer installs them too when its first step starts (other callers). The
// handlers only record the signal; the trainer
// looks at it at the next step boundary, agrees on it with every rank (the step's statistics
// reduction carries it), saves a checkpoint and returns. A second Ctrl-C ends the process at once.
#pragma once

namespace moe {

// Installs the handlers for SIGTERM, SIGUSR1, SIGHUP and SIGINT (idempotent); a SIGHUP that is
// ignored already (nohup) stays ignored.
void install_stop_handlers();
// The first stop signal received (0 = none), e.g. SIGTERM.
int stop_signal();
// "SIGTERM", "SIGUSR1", "SIGINT".
const char* signal_name(int signo);

}  // namespace moe

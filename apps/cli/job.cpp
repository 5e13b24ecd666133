#include "cli/job.h"

#include <cstdio>
#include <exception>
#include <new>

#include "cli/arguments.h"
#include "moe/comm/host_strings.h"
#include "moe/comm/launcher.h"

namespace moe::cli {

int Job::start(int* argc, char*** argv, const CommandLine& line) {
  command_ = line.command;
  // Under mpirun (or srun) every process is one rank; otherwise one process without MPI.
  const moe::LaunchInfo launch = moe::detect_launcher();
  if (!line.help.empty() && launch.kind != moe::Launcher::Mpi) {
    std::fputs(line.help.c_str(), stdout);
    return 0;
  }
  if (!line.refusal.empty() && launch.kind != moe::Launcher::Mpi) {
    std::fprintf(stderr, "error: %s\n", line.refusal.c_str());
    return kUsageError;
  }
  if (launch.kind == moe::Launcher::Refused) {
    std::fprintf(stderr, "error: %s\n", launch.why.c_str());
    return 1;
  }
  if (launch.kind == moe::Launcher::Mpi) {
    mpi_ = std::make_unique<moe::MpiRuntime>(argc, argv);
    world_ = &mpi_->world();
  }
  if (world_->size() > 1) return agree_on_command_line(line);
  if (!line.help.empty()) {
    std::fputs(line.help.c_str(), stdout);
    return 0;
  }
  if (line.refusal.empty()) return -1;
  return error_once(line.refusal, kUsageError);
}

// Every rank must run the same command. Ranks started with different subcommands, a train whose
// --resume, --init-from or --overwrite differ, or a bench whose --check or --calibrate do (an
// MPMD launch, `mpirun A : B`), would wait in different collectives for ever; the config's own
// agreement covers --config, --set and the flags that become config keys. A rank whose command
// line CLI11 refused joins the agreement with why: the same refusal on every rank is printed
// once; one that only some ranks meet is printed by each of them, with its rank, as rank 0 alone
// does not know it. A rank asked for --help joins too (had it printed the help and left, the others
// would wait for it in MPI_Init for ever): --help on every rank prints the help once.
int Job::agree_on_command_line(const CommandLine& line) {
  // Tagged: a refusal never reads as a command.
  static const std::string kRuns = "runs ", kRefused = "refused ";
  const bool refused = !line.refusal.empty(), help = !line.help.empty();
  const std::string offer = refused ? kRefused + line.refusal
                            : help  ? kRuns + line.command + (line.command.empty() ? "" : " ") + "--help"
                                    : kRuns + line.command + line.agreed_flags;
  const moe::StringAgreement same = moe::agree_on_string(*world_, offer);
  if (same.differing_rank < 0 && help) {
    if (leader()) std::fputs(line.help.c_str(), stdout);
    std::fflush(stdout);
    world_->barrier();
    return 0;
  }
  if (same.differing_rank < 0) return refused ? error_once(line.refusal, kUsageError) : -1;
  auto is_refusal = [&](const std::string& text) { return text.rfind(kRefused, 0) == 0; };
  if (refused) {
    std::fprintf(stderr, "error (rank %d): %s\n", world_->rank(), line.refusal.c_str());
  } else if (leader() && !is_refusal(same.differing)) {
    // Else the differing rank prints its refusal.
    std::fprintf(stderr,
                 "error: the ranks were started with different commands: rank 0 runs `moetrain %s` but rank %d "
                 "runs `moetrain %s`; every rank must run the same one\n",
                 same.leader.substr(kRuns.size()).c_str(), same.differing_rank,
                 same.differing.substr(kRuns.size()).c_str());
  }
  world_->barrier();  // the printing ranks first: mpirun ends the job at the first non-zero exit
  return kUsageError;
}

int Job::error_once(const std::string& what, int code) {
  if (leader()) std::fprintf(stderr, "error: %s\n", what.c_str());
  if (world_->size() > 1) world_->barrier();
  return code;
}

int Job::agree_at_startup(const std::function<void()>& work) {
  int code = 0;
  std::string what;
  try {
    work();
  } catch (const UsageError& e) {
    code = kUsageError, what = e.what();
  } catch (const std::bad_alloc&) {
    code = 1, what = out_of_memory();
  } catch (const std::exception& e) {
    code = 1, what = e.what();
  }
  if (world_->size() > 1) {
    const moe::StringAgreement a = moe::agree_on_string(*world_, std::to_string(code) + " " + what);
    if (a.differing_rank >= 0) {
      // Not every rank alike: the lowest failing rank's error, named, printed once; every rank exits
      // with its code. Another rank's different error shows once this one is fixed.
      const bool leader_failed = a.leader.rfind("0 ", 0) != 0;
      const std::string& first = a.lowest_failure(leader_failed);
      const size_t space = first.find(' ');
      return error_once("rank " + std::to_string(a.lowest_failing_rank(leader_failed)) + ": " + first.substr(space + 1),
                        std::stoi(first.substr(0, space)));
    }
  }
  if (code == 0) return -1;
  return error_once(what, code);
}

int Job::fail(const char* what) {
  if (mpi_ && world_->size() > 1) moe::MpiRuntime::abort_job(what, 1);
  std::fprintf(stderr, "error: %s\n", what);
  return 1;
}

std::string Job::out_of_memory() const {
  return "out of memory in `moetrain " + command_ +
         "`: a size in the config, the data or a checkpoint is too large for this machine";
}

}  // namespace moe::cli

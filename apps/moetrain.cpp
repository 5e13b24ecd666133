// moetrain: the command line. Subcommands: train, bench, eval, plan, export-hf, import-hf, prepare, keys
// (apps/cli/<name>_command.cpp each). Every error is reported as one "error: ..." line and a non-zero exit.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "cli/arguments.h"
#include "cli/command.h"
#include "cli/job.h"
#include "moe/core/interrupt_guard.h"
#include "moe/train/stop_request.h"

namespace {

// Why CLI11 refused the command line: the text of its one error line.
std::string refusal(const CLI::App& app, int argc, char** argv, const CLI::ParseError& e) {
  // A misspelled command ("trian") reaches CLI11 as a stray word, reported as "a subcommand is
  // required": name the word and the commands instead.
  if (argc > 1 && argv[1][0] != '-' && app.get_subcommands().empty()) {
    std::string names;
    for (const CLI::App* sub : app.get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
    return "unknown command '" + std::string(argv[1]) + "'; the commands are " + names + " (see moetrain --help)";
  }
  return std::string(e.what()) + " (see moetrain --help)";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace moe::cli;
  // OpenMP threads that spin while waiting (libgomp's default) steal the cores from OpenBLAS and
  // from each other whenever anything else runs on the machine: on 2 busy cores a step ran 17x
  // slower. libgomp reads OMP_WAIT_POLICY once at load time, so set it and re-execute once.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);  // returns only on failure; then run with the default policy
  }
  // A write past the file-size limit (ulimit -f) raises SIGXFSZ, whose default action kills the
  // process with no message and leaves its temporary files. Ignored, the write fails with EFBIG
  // instead, and the writers' own error path names the file and removes what they started.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"moetrain: Mixture-of-Experts training"};
  app.require_subcommand(1);
  const std::vector<Command> commands = {add_train_command(app),     add_bench_command(app),
                                         add_prepare_command(app),   add_eval_command(app),
                                         add_export_hf_command(app), add_import_hf_command(app),
                                         add_plan_command(app),      add_keys_command(app)};

  // Usage errors (an unknown flag, a bad value) exit 2 with one line; --help exits 0.
  CommandLine line;
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    // --help: printed by Job::start, which under mpirun first has every rank join the job.
    std::ostringstream text, unused;
    if (app.exit(e, text, unused) != 0) return app.exit(e);
    line.help = text.str();
    for (const Command& c : commands)
      if (c.app->parsed()) line.command = c.app->get_name();
  } catch (const CLI::ParseError& e) {
    // Reported once MPI is up under mpirun: the other ranks' command lines may have parsed.
    line.refusal = refusal(app, argc, argv, e);
  }
  const Command* command = nullptr;
  if (line.refusal.empty() && line.help.empty()) {
    command = &*std::find_if(commands.begin(), commands.end(), [](const Command& c) { return c.app->parsed(); });
    line.command = command->app->get_name();
    if (command->agreed_flags) line.agreed_flags = command->agreed_flags();
  }

  // A training's stop signal (a scheduler's SIGUSR1 or SIGTERM, Ctrl-C) counts from here, before MPI
  // starts and the config is read: it stops the run at its first step boundary with a checkpoint,
  // where the default action of an early one killed it.
  if (line.command == "train" && line.refusal.empty() && line.help.empty()) moe::install_stop_handlers();
  Job job;
  if (const int code = job.start(&argc, &argv, line); code >= 0) return code;  // a refused line ends here
  try {
    if (command->one_process && job.world().size() > 1)
      return job.error_once("`moetrain " + command->app->get_name() + "` runs in one process; run it without " +
                                "mpirun or srun (this job has " + std::to_string(job.world().size()) + " ranks)",
                            1);
    return command->run(job);
  } catch (const std::bad_alloc&) {
    return job.fail(job.out_of_memory().c_str());
  } catch (const moe::Interrupted& e) {  // export-hf, import-hf: their temporaries are gone
    job.fail(e.what());
    moe::die_of_signal(e.signal());
  } catch (const moe::AgreedError& e) {  // every rank threw it: printed once, no MPI_Abort
    return job.error_once(e.what(), 1);
  } catch (const std::exception& e) {
    return job.fail(e.what());
  }
}

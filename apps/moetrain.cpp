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
#include <string>
#include <vector>

#include "cli/arguments.h"
#include "cli/command.h"
#include "cli/job.h"
#include "moe/comm/launcher.h"

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
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Under mpirun every rank parses the same words: the launcher's rank 0 alone reports them.
    if (moe::launch_rank() != 0) return kUsageError;
    // A misspelled command ("trian") reaches CLI11 as a stray word, reported as "a subcommand is
    // required": name the word and the commands instead.
    if (argc > 1 && argv[1][0] != '-' && app.get_subcommands().empty()) {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
      std::fprintf(stderr, "error: unknown command '%s'; the commands are %s (see moetrain --help)\n", argv[1],
                   names.c_str());
      return kUsageError;
    }
    std::fprintf(stderr, "error: %s (see moetrain --help)\n", e.what());
    return kUsageError;
  }
  const Command& command =
      *std::find_if(commands.begin(), commands.end(), [](const Command& c) { return c.app->parsed(); });

  Job job;
  const std::string agreed_flags = command.agreed_flags ? command.agreed_flags() : "";
  if (const int code = job.start(&argc, &argv, command.app->get_name(), agreed_flags); code >= 0) return code;
  try {
    if (command.one_process && job.world().size() > 1)
      return job.error_once("`moetrain " + command.app->get_name() + "` runs in one process; run it without " +
                                "mpirun or srun (this job has " + std::to_string(job.world().size()) + " ranks)",
                            1);
    return command.run(job);
  } catch (const std::bad_alloc&) {
    return job.fail(job.out_of_memory().c_str());
  } catch (const std::exception& e) {
    return job.fail(e.what());
  }
}

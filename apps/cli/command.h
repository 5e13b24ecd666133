// moetrain's subcommands: apps/cli/<name>_command.cpp adds one to the CLI11 app (hf_commands.cpp
// both export-hf and import-hf), with the options it parses into, and returns what runs it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "cli/job.h"

namespace moe::cli {

struct Command {
  CLI::App* app = nullptr;
  // Runs the parsed command on this process's rank of the job; returns the exit status. An error
  // it throws ends the job with exit status 1 (Job::fail).
  std::function<int(Job&)> run;
  // The flags, after the command's name, that every rank must be given alike because they change
  // which collectives run (the config's own agreement covers --config, --set and the flags that
  // become config keys); none when null.
  std::function<std::string()> agreed_flags;
  // It writes one output or prints one listing: several ranks would race each other.
  bool one_process = false;
};

Command add_train_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_prepare_command(CLI::App& app);
Command add_eval_command(CLI::App& app);
Command add_export_hf_command(CLI::App& app);
Command add_import_hf_command(CLI::App& app);
Command add_plan_command(CLI::App& app);
Command add_keys_command(CLI::App& app);

}  // namespace moe::cli

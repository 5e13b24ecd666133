// This process's part of the job: one process without a launcher, or one rank under mpirun or
// srun; and how an error is reported so that it is printed once and no rank waits for ever.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "moe/comm/local_communicator.h"
#include "moe/comm/mpi_communicator.h"

namespace moe::cli {

// This process's command line as the ranks compare it.
struct CommandLine {
  std::string command;       // the subcommand ("train"); "" when refused
  std::string agreed_flags;  // the flags every rank must be given alike (Command::agreed_flags)
  std::string refusal;       // why CLI11 could not parse it, a usage error; "" when it parsed
  std::string help;          // --help: the text to print (command: the subcommand it is for, or "")
};

class Job {
 public:
  Job() = default;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // Joins the job: refuses a launcher that starts several processes without MPI (exit 1),
  // initializes MPI under mpirun or srun, and makes every rank agree that it runs the same
  // command line (exit 2 when not, or when one was refused). Returns -1 to go on, else the exit
  // status.
  int start(int* argc, char*** argv, const CommandLine& line);

  moe::Communicator& world() { return *world_; }
  bool leader() const { return world_->rank() == 0; }

  // An error every rank meets alike (the same arguments, or a moe::AgreedError): printed by rank
  // 0, which the others wait for before they return `code`.
  int error_once(const std::string& what, int code);

  // Start-up work every rank does alike: the command line's checks and reading the config, which
  // are the same on every rank. An error that every rank meets with the same message is printed
  // once, by rank 0, and every rank returns its exit status (UsageError: 2, else 1): MPI_Abort
  // would print it once per rank that got there first, under Open MPI's abort banner. An error
  // only some ranks meet (a file one node cannot read) is printed once too, the lowest failing
  // rank's, named ("rank 1: ..."), with its exit status on every rank. Returns -1 to go on, else
  // the exit status.
  int agree_at_startup(const std::function<void()>& work);

  // An error while running: a rank that throws ends the whole job (no rank is left waiting in a
  // collective). Returns the exit status, 1.
  int fail(const char* what);

  // Sizes are checked against memory where they are read; this is what slips through.
  std::string out_of_memory() const;

 private:
  int agree_on_command_line(const CommandLine& line);

  std::string command_;
  std::unique_ptr<moe::MpiRuntime> mpi_;
  moe::LocalCommunicator local_;
  moe::Communicator* world_ = &local_;
};

}  // namespace moe::cli

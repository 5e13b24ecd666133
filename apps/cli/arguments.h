// What the subcommands' command lines share: the exit status of a command line that cannot be used,
// the validators of counts and paths, --config/--set, and the checks of output files named on it.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "moe/train/config.h"

namespace moe::cli {

// Exit status of a command line that cannot be parsed (errors while running exit 1).
constexpr int kUsageError = 2;

// A command line that cannot be used, found only once the config or run.dir is read (exit 2).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Counts on the command line, with errors that state their range in plain integers (CLI11's
// NonNegativeNumber / PositiveNumber print it as doubles up to 1.8e308); a flag that sets a config
// key takes that key's range (at most 2^40), so a value past it is a usage error.
extern const CLI::Range kCountFromZero;
extern const CLI::Range kCountFromOne;
extern const CLI::Range kKeepLastRange;  // train.keep_last's range, for --keep-last
extern const CLI::Range kAnyNonNegative;  // a flag of no config key (eval --tokens): any int64 >= 0
// Integers on the command line are decimal ("010" is 10; "0x10" and "1e3" are refused).
extern const CLI::Validator kDecimal;
// A path flag given as "" (a script's unset variable) would silently mean "not given".
extern const CLI::Validator kNonEmpty;

// A --set that is not "section.key=value" ("" when it is): a usage error, checked by CLI11.
std::string set_form_error(const std::string& assignment);

// A flag that stands for an integer config key (--steps N is train.steps = N).
struct KeyFlag {
  std::string flag;                  // "--steps"
  std::string key;                   // "train.steps"
  int64_t moe::TrainConfig::*field;  // &TrainConfig::steps
  int64_t value;
};

// --config and --set of a subcommand that reads a config.
struct ConfigArgs {
  std::string config = "tiny";
  std::vector<std::string> overrides;
  void add_to(CLI::App* cmd);
  // The config file with the --set overrides, then the flags' values (they win over --set). Each
  // error names its source: the file, the --set overrides the user typed, or the flag.
  moe::Config load(const std::vector<KeyFlag>& flags = {}) const;
};

// Why an output file named on the command line could not be written at the end of the command
// ("" when it can): checked before the work, so a typo does not cost a whole bench or eval.
std::string unwritable_output(const std::string& path);

// Refuses (moe::Error, exit 1) an output file `flag` names that could not be written at the end of
// the command or that already exists: nothing is overwritten. "" (not asked for) passes.
void check_new_output(const char* flag, const std::string& path);

}  // namespace moe::cli

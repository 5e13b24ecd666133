#include "cli/arguments.h"

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <limits>

#include "moe/core/error.h"
#include "moe/train/config_keys.h"

namespace moe::cli {

// A --set without "section.key=" is a command line that cannot be used (exit 2, as CLI11's own
// errors); what the value means is the config's to judge (exit 1).
std::string set_form_error(const std::string& assignment) {
  // A key (each part a name; the spaces TOML allows around them are dropped) nests at most one
  // level (`name`, `section.key`), and one --set holds one value: a newline would end it there and
  // the rest was dropped.
  const std::string key = moe::override_key(assignment);
  if (key.empty() || std::count(key.begin(), key.end(), '.') > 1 ||
      assignment.find_first_of("\n\r") != std::string::npos) {
    std::string shown;  // one line: line breaks written as \n
    for (char c : assignment) shown += c == '\n' ? "\\n" : c == '\r' ? "\\r" : std::string(1, c);
    return "expects section.key=value, got '" + shown + "'";
  }
  return "";
}

void ConfigArgs::add_to(CLI::App* cmd) {
  cmd->add_option("--config", config, "TOML config file, or 'tiny' for the built-in default")->capture_default_str();
  cmd->add_option("--set", overrides, "override a config key: --set section.key=value (repeatable)")
      ->check(set_form_error);
}

moe::Config ConfigArgs::load(const std::vector<KeyFlag>& flags) const {
  // The flags are not appended to the --set overrides: the config reader cannot tell one override
  // from another, so an error in the file was then reported "with --set overrides" and a file
  // whose section is not a table blamed on "--set train.steps", a --set nobody typed. Instead
  // each value is read as a config of its own named after the flag (its key's type and range
  // checked there), then set. The file must hold valid values for these keys too.
  moe::Config cfg = moe::load_config(config, overrides);
  if (flags.empty()) return cfg;
  for (const KeyFlag& f : flags) {
    const moe::Config alone =
        moe::parse_config(f.key + " = " + std::to_string(f.value) + "\n", f.flag, {}, /*validate=*/false);
    cfg.train.*f.field = alone.train.*f.field;
  }
  cfg.validate();  // the keys checked against each other with the flags' values
  return cfg;
}

// The config keys' own bounds: a value past them is a usage error (exit 2) stating the real range,
// not a config error after parsing.
const CLI::Range kCountFromZero(int64_t{0}, moe::kMaxCount);
const CLI::Range kCountFromOne(int64_t{1}, moe::kMaxCount);
const CLI::Range kKeepLastRange(int64_t{0}, moe::kMaxKeepLast);
const CLI::Range kAnyNonNegative(int64_t{0}, std::numeric_limits<int64_t>::max());

// CLI11 converts integers with base detection (strtoll base 0), so `--steps 010` ran 8 steps and
// `0x10` 16; here leading zeros are dropped ("010" is 10) and any other form is refused, before
// the range check.
const CLI::Validator kDecimal(
    [](std::string& text) -> std::string {
      const size_t sign = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
      if (sign == text.size() || !std::all_of(text.begin() + static_cast<std::ptrdiff_t>(sign), text.end(),
                                              [](char c) { return c >= '0' && c <= '9'; }))
        return "'" + text + "' is not a decimal integer";
      const size_t first = text.find_first_not_of('0', sign);
      const std::string digits = first == std::string::npos ? "0" : text.substr(first);
      // strtoll saturates what does not fit, and CLI11 took the saturated value.
      const std::string max = std::to_string(std::numeric_limits<int64_t>::max());
      if (digits.size() > max.size() || (digits.size() == max.size() && digits > max))
        return "'" + text + "' is out of range";
      text = text.substr(0, sign) + digits;
      return "";
    },
    "DECIMAL");

const CLI::Validator kNonEmpty([](std::string& text) { return text.empty() ? std::string("must not be empty") : ""; },
                               "NONEMPTY");

std::string unwritable_output(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::absolute(path).parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(parent, ec))
    return "its folder " + parent.string() +
           (std::filesystem::exists(parent, ec) ? " is not a folder" : " does not exist");
  if (access(parent.c_str(), W_OK) != 0) return "its folder " + parent.string() + " is not writable";
  return "";
}

void check_new_output(const char* flag, const std::string& path) {
  if (path.empty()) return;
  if (const std::string why = unwritable_output(path); !why.empty())
    MOE_FAIL(flag, " ", path, " cannot be written: ", why);
  MOE_CHECK(!std::filesystem::exists(std::filesystem::symlink_status(path)), flag, " ", path,
            " exists; choose a new file name (nothing is overwritten)");
}

}  // namespace moe::cli

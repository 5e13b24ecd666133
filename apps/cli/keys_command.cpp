// moetrain keys: every config key as a markdown table (type, default, accepted values, meaning).
#include <cstdio>

#include "cli/command.h"
#include "moe/train/config.h"

namespace moe::cli {

Command add_keys_command(CLI::App& app) {
  CLI::App* keys = app.add_subcommand("keys", "list every config key: type, default, accepted values, meaning");
  auto list_keys = [](Job&) {
    std::printf("%s", moe::config_keys_markdown().c_str());
    return 0;
  };
  return {keys, list_keys, /*agreed_flags=*/nullptr, /*one_process=*/true};
}

}  // namespace moe::cli

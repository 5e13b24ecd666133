// Reading a parsed TOML table into a Config: every key of the key table (config_keys.h) is taken
// with its type and range checked, keys whose default follows another key are filled in, and any
// key left over is refused as unknown, so a typo never silently falls back to a default.
// Turning text, files and --set overrides into that table is config_parse.cpp's job.
#pragma once

#include <string>
#include <toml++/toml.h>

#include "moe/train/config.h"

namespace moe {

// `source` names the config in messages ("configs/x.toml (with --set overrides)"). Checks each
// value on its own (type, range, known key) and the keys that the table alone decides (data.path
// with [[data.sources]]); Config::validate, the checks across keys, is left to the caller.
Config read_config_table(const toml::table& root, const std::string& source);

}  // namespace moe

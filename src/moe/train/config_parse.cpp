// Text into a Config: TOML text, a file or the built-in tiny config is parsed into a table, the
// --set overrides are applied to that table (and, for a config a checkpoint stored, keys in an older
// form are rewritten to today's), then config_reader.cpp reads the table and Config::validate
// checks the result. Also the duration text of train.max_duration.
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include <toml++/toml.h>

#include "moe/core/error.h"
#include "moe/train/builtin_configs.h"
#include "moe/train/config.h"
#include "moe/train/config_key_text.h"
#include "moe/train/config_reader.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

toml::table parse_toml(const std::string& text, const std::string& source) {
  try {
    return toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    MOE_FAIL("malformed TOML in ", source, " at line ", where.line, ", column ", where.column, ": ",
             std::string(e.description()));
  }
}

// Without the spaces and tabs around it: TOML's layout, not part of a name or a bare value.
std::string trim_layout(const std::string& t) {
  const size_t first = t.find_first_not_of(" \t"), last = t.find_last_not_of(" \t");
  return first == std::string::npos ? std::string() : t.substr(first, last - first + 1);
}

// "section.key=value": the value is parsed as a TOML value; a bare word becomes a string.
void apply_override(toml::table& root, const std::string& assignment) {
  const std::string path = override_key(assignment);
  MOE_CHECK(!path.empty(), "--set expects section.key=value, got '", assignment, "'");
  const std::string value = trim_layout(assignment.substr(assignment.find('=') + 1));
  const auto dot = path.find('.');
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error& e) {
    // A bare word (a path, a name) is taken as a string. A value that opens an array, an inline
    // table or a quoted string but does not parse is a typo: as a string it would be reported as
    // the wrong kind of value, or kept with its stray quote.
    const size_t first = value.find_first_not_of(" \t");
    const char opener = first == std::string::npos ? ' ' : value[first];
    const bool array = opener == '[', table = opener == '{';
    const std::string closer = array ? "]" : table ? "}" : std::string(1, opener);
    const char shell_quote = opener == '\'' ? '"' : '\'';
    MOE_CHECK(!array && !table && opener != '"' && opener != '\'', "--set ", assignment, ": the ",
              array ? "array " : table ? "inline table " : "quoted string ", value, " given for ", path,
              " could not be parsed (TOML: ", std::string(e.description()), "); end it with ", closer,
              " and quote the whole assignment for the shell, as in --set ", shell_quote, path, "=", opener, "...",
              closer, shell_quote);
    parsed.insert_or_assign("v", value);
  }
  toml::node* v = parsed.get("v");
  if (dot == std::string::npos) {
    root.insert_or_assign(path, *v);
    return;
  }
  const std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  MOE_CHECK(key.find('.') == std::string::npos, "--set ", path, ": expected section.key");
  toml::node* s = root.get(section);
  MOE_CHECK(!s || s->is_table(), "--set ", path, ": '", section, "' is not a config section");
  if (!s) root.insert_or_assign(section, toml::table{});
  root.get_as<toml::table>(section)->insert_or_assign(key, *v);
}

// A stored config's keys in the form older versions wrote, rewritten to today's form:
// - parallel.pp_layers = "3,1" (a comma-separated string before it became an array). A string that
//   is not a list of integers is left for the reader to refuse.
// - data.path = "synthetic" beside [[data.sources]]: its unused default, which configs with sources
//   carried until 2026-12-07 (the reader refuses a data.path given with sources).
void read_older_stored_forms(toml::table& root) {
  toml::table* parallel = root.get_as<toml::table>("parallel");
  toml::node* layers = parallel ? parallel->get("pp_layers") : nullptr;
  if (layers && layers->is_string()) {
    if (const auto values = integers_in_string(*layers->value<std::string>())) {
      toml::array array;
      for (int64_t v : *values) array.push_back(v);
      parallel->insert_or_assign("pp_layers", std::move(array));
    }
  }
  toml::table* data = root.get_as<toml::table>("data");
  const toml::node* path = data ? data->get("path") : nullptr;
  if (path && path->value<std::string>() == "synthetic" && data->get("sources")) data->erase("path");
}

Config parse_config_text(const std::string& toml_text, const std::string& source_name,
                         const std::vector<std::string>& overrides, bool validate, bool stored,
                         size_t callers_overrides) {
  toml::table root = parse_toml(toml_text, source_name);
  if (stored) read_older_stored_forms(root);
  for (const auto& o : overrides) apply_override(root, o);
  const bool users = overrides.size() > callers_overrides;
  const std::string source = users ? source_name + " (with --set overrides)" : source_name;
  Config c = read_config_table(root, source);
  if (validate) c.validate();
  return c;
}

}  // namespace

std::string override_key(const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos) return "";
  const std::string key = trim_layout(assignment.substr(0, eq));
  const size_t dot = key.find('.');
  // The one key outside a section is `name`; any other dotless path would name a whole section
  // (train={steps=2}), whose table would replace every key the config file set there.
  if (dot == std::string::npos) return key == "name" ? key : "";
  const std::string section = trim_layout(key.substr(0, dot)), name = trim_layout(key.substr(dot + 1));
  return section.empty() || name.empty() ? "" : section + "." + name;
}

Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides, bool validate) {
  return parse_config_text(toml_text, source_name, overrides, validate, /*stored=*/false, /*callers_overrides=*/0);
}

Config parse_stored_config(const std::string& toml_text, const std::string& source_name,
                           const std::vector<std::string>& overrides, bool validate, size_t callers_overrides) {
  return parse_config_text(toml_text, source_name, overrides, validate, /*stored=*/true, callers_overrides);
}

bool written_config_text(const std::string& toml_text) {
  try {
    const toml::table root = toml::parse(toml_text);
    std::ostringstream as_is;
    as_is << root << "\n";
    if (as_is.str() != toml_text) return false;  // laid out by hand, or with comments
    toml::table today = root;
    read_older_stored_forms(today);
    std::ostringstream in_todays_form;
    in_todays_form << today << "\n";
    Config c = read_config_table(today, "config");
    c.validate();
    return config_to_toml(c) == in_todays_form.str();
  } catch (const std::exception&) {
    return false;
  }
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  MOE_CHECK(!path.empty(), "--config is empty: give a .toml file, or 'tiny' for the built-in config");
  if (path == "tiny") return parse_config(builtin::kTinyToml, "built-in config 'tiny'", overrides);
  std::error_code ec;
  MOE_CHECK(fs::exists(path, ec), "config file '", path, "' does not exist (--config)");
  MOE_CHECK(fs::is_regular_file(path, ec), "config file '", path,
            "' is not a regular file (--config takes a .toml file)");
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "cannot read config file '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  MOE_CHECK(!in.bad(), "cannot read config file '", path, "'");
  // A run folder's config.toml as moetrain wrote it (--config <run>/config.toml) may be in a form an
  // older moetrain wrote: read as the checkpoints' stored configs are.
  const std::string text = ss.str();
  if (text.rfind(std::string(kConfigHeader) + "\n", 0) == 0) return parse_stored_config(text, path, overrides);
  return parse_config(text, path, overrides);
}

double parse_duration(const std::string& text, const std::string& key) {
  if (text.empty()) return 0;
  const std::string usage = "\" is not a duration; write e.g. \"4h\", \"1h30m\", \"45m\" or \"90s\"";
  double total = 0;
  size_t i = 0;
  int parts = 0;
  double last_unit = 0;  // units go from the largest down, each once: "1h30m", not "30m1h" or "1h1h"
  while (i < text.size()) {
    // A plain decimal number: digits with at most one point (no sign, exponent or hex, which
    // std::stod would take: "0x10s", "+5m").
    const size_t start = i;
    bool digits = false, point = false;
    for (; i < text.size(); ++i) {
      const char c = text[i];
      if (c >= '0' && c <= '9')
        digits = true;
      else if (c == '.' && !point)
        point = true;
      else
        break;
    }
    MOE_CHECK(digits, key, " = \"", text, usage);
    double v = 0;
    try {
      v = std::stod(text.substr(start, i - start));
    } catch (const std::out_of_range&) {  // past a double's range, either way
      MOE_FAIL(key, " = \"", text, usage);
    }
    double unit = 1;
    if (i < text.size()) {
      const char u = text[i++];
      unit = u == 's' ? 1 : u == 'm' ? 60 : u == 'h' ? 3600 : u == 'd' ? 86400 : -1;
      MOE_CHECK(unit > 0, key, " = \"", text, "\": unknown unit '", u, "' (use s, m, h or d)");
      MOE_CHECK(last_unit == 0 || unit < last_unit, key, " = \"", text,
                "\": each unit once, from the largest down (e.g. \"1d2h\", \"1h30m\")");
      last_unit = unit;
    } else {
      MOE_CHECK(parts == 0, key, " = \"", text, "\": a unit (s, m, h or d) must follow every number but the only one");
    }
    total += v * unit;
    ++parts;
  }
  MOE_CHECK(total > 0, key, " = \"", text, "\" must be longer than zero (\"\" means no limit)");
  // The deadline is kept in the steady clock's nanoseconds (int64: ~292 years); a longer one
  // would wrap around into the past and stop the run at its first step.
  constexpr double kLongest = 100.0 * 365 * 86400;
  MOE_CHECK(total <= kLongest, key, " = \"", text, "\" is longer than 100 years; \"\" means no limit");
  return total;
}

}  // namespace moe

#include "moe/train/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "moe/core/error.h"
#include "moe/train/builtin_configs.h"
#include "moe/train/config_keys.h"
#include "moe/train/pipeline_layout.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

std::string dotted(const char* section, const char* name) {
  return *section ? std::string(section) + "." + name : std::string(name);
}

template <typename T>
std::string range_text(const Range<T>& r) {
  std::ostringstream os;
  os.precision(6);
  if constexpr (std::is_integral_v<T>)
    if (r.lo && r.hi && *r.hi == static_cast<T>(kMaxCount)) {
      // The cap on counts is a sanity bound against overflowing size products, not a real limit.
      os << ">= " << *r.lo << " (at most 2^40)";
      return os.str();
    }
  if (r.lo && r.hi) {
    os << "in " << (r.lo_open ? "(" : "[") << *r.lo << ", " << *r.hi << (r.hi_open ? ")" : "]");
  } else if (r.lo) {
    os << (r.lo_open ? "> " : ">= ") << *r.lo;
  } else if (r.hi) {
    os << (r.hi_open ? "< " : "<= ") << *r.hi;
  }
  return os.str();
}

template <typename T>
bool in_range(const Range<T>& r, T v) {
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(v)) return false;
  if (r.lo && (r.lo_open ? !(v > *r.lo) : !(v >= *r.lo))) return false;
  if (r.hi && (r.hi_open ? !(v < *r.hi) : !(v <= *r.hi))) return false;
  return true;
}

template <typename E>
std::string choice_names(const Choices<E>& choices) {
  std::string names;
  for (const auto& c : choices) names += (names.empty() ? "" : ", ") + c.first;
  return names;
}

template <typename E>
const std::string& choice_name(const Choices<E>& choices, const E& value) {
  for (const auto& c : choices)
    if (c.second == value) return c.first;
  MOE_FAIL("config: a value has no name among the choices ", choice_names(choices));
}

// [3, 1]: an integer array as TOML writes it (without toml++'s inner padding), for messages and comparisons.
std::string integers_text(const std::vector<int64_t>& values, const char* separator = ", ") {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? separator : "") + std::to_string(values[i]);
  return s + "]";
}

// "3, 1" -> {3, 1}; "" -> {}; nullopt when a piece is not an integer. Reads the comma-separated
// string form an integer array once had, to show it as an array or to read an older stored config.
std::optional<std::vector<int64_t>> integers_in_string(const std::string& text) {
  std::vector<int64_t> out;
  if (text.find_first_not_of(' ') == std::string::npos) return out;
  std::stringstream in(text);
  std::string piece;
  while (std::getline(in, piece, ',')) {
    const size_t first = piece.find_first_not_of(' '), last = piece.find_last_not_of(' ');
    if (first == std::string::npos) return std::nullopt;
    int64_t v = 0;
    const char* end = piece.data() + last + 1;
    const auto [ptr, ec] = std::from_chars(piece.data() + first, end, v);
    if (ec != std::errc() || ptr != end) return std::nullopt;
    out.push_back(v);
  }
  if (text.back() == ',') return std::nullopt;
  return out;
}

std::string describe(const toml::node& n) {
  std::ostringstream os;
  n.visit([&](auto&& value) { os << value; });
  return os.str();
}

// One TOML value into a typed field, checking its type and range; `where` names the key.
template <typename T>
void read_value(const toml::node& node, T& out, const Range<T>& range, const std::string& where) {
  if constexpr (std::is_same_v<T, bool>) {
    const auto v = node.value<bool>();
    MOE_CHECK(v.has_value() && node.is_boolean(), where, " must be true or false, got ", describe(node));
    out = *v;
  } else if constexpr (std::is_integral_v<T>) {
    MOE_CHECK(node.is_integer(), where, " must be an integer, got ", describe(node));
    const int64_t v = *node.value<int64_t>();
    MOE_CHECK(!std::is_unsigned_v<T> || v >= 0, where, " must be >= 0, got ", v);
    MOE_CHECK(in_range(range, static_cast<T>(v)), where, " must be ", range_text(range), ", got ", v);
    out = static_cast<T>(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    MOE_CHECK(node.is_floating_point() || node.is_integer(), where, " must be a number, got ", describe(node));
    // An integer is converted here: toml++'s value<double>() is empty for one a double cannot hold
    // exactly (past 2^53), and reading that empty optional gave whatever the memory held.
    const double v = node.is_integer() ? static_cast<double>(*node.value<int64_t>()) : *node.value<double>();
    MOE_CHECK(in_range(range, v), where, " must be a finite number ", range_text(range), ", got ", describe(node));
    out = v;
  } else {
    MOE_CHECK(node.is_string(), where, " must be a string, got ", describe(node));
    out = *node.value<std::string>();
  }
}

// The fields of one table of an array of tables ([[data.sources]]): known names, typed values.
class ItemReader {
 public:
  // item: "data.sources[0]"; source: the file the config came from.
  ItemReader(const toml::table& table, std::string item, std::string source)
      : table_(table), item_(std::move(item)), source_(std::move(source)) {}
  template <typename T>
  void key(const char* name, T& out, const Range<T>& range, const char*) {
    known_.insert(name);
    if (const toml::node* node = table_.get(name))
      read_value(*node, out, range, "config key '" + item_ + "." + name + "' in " + source_);
  }
  void reject_unknown() const {
    for (auto&& [k, v] : table_) {
      (void)v;
      std::string names;
      for (const auto& n : known_) names += (names.empty() ? "" : ", ") + n;
      MOE_CHECK(known_.count(std::string(k.str())), "unknown key '", std::string(k.str()), "' in ", item_, " (",
                source_, "); known keys: ", names);
    }
  }

 private:
  const toml::table& table_;
  std::string item_, source_;
  std::set<std::string> known_;
};

// Reads every key of the table out of the parsed TOML (absent keys keep their defaults), checks
// each value's type and range, and remembers which keys exist, so anything left over in the file
// is reported as unknown (a typo never silently falls back to a default).
class TomlReader {
 public:
  TomlReader(const toml::table& root, std::string source) : root_(root), source_(std::move(source)) {}

  template <typename T>
  void key(const char* section, const char* name, T& out, const Range<T>& range, const char*) {
    const toml::node* node = take(section, name);
    if (!node) return;
    read_value(*node, out, range, where(section, name));
  }

  template <typename E>
  void choice(const char* section, const char* name, E& out, const Choices<E>& choices, const char*) {
    const toml::node* node = take(section, name);
    if (!node) return;
    MOE_CHECK(node->is_string(), where(section, name), " must be one of: ", choice_names(choices), "; got ",
              describe(*node));
    const std::string text = *node->value<std::string>();
    for (const auto& [label, value] : choices)
      if (label == text) {
        out = value;
        return;
      }
    MOE_FAIL(dotted(section, name), " = \"", text, "\" is not one of: ", choice_names(choices), " (config key in ", source_,
             ")");
  }

  void integer_array(const char* section, const char* name, std::vector<int64_t>& out, const Range<int64_t>& range,
                     const char*) {
    const toml::node* node = take(section, name);
    if (!node) return;
    if (!node->is_array()) {
      // Reported once every key is read, with an example that is valid for the configured model.
      if (!not_an_array_) {
        not_an_array_ = NotAnArray{dotted(section, name), where(section, name), node->is_string(), describe(*node)};
        if (node->is_string()) not_an_array_->text = *node->value<std::string>();
      }
      return;
    }
    const toml::array* array = node->as_array();
    std::vector<int64_t> values(array->size());
    for (size_t i = 0; i < array->size(); ++i)
      read_value(*array->get(i), values[i], range,
                 where(section, name) + " (element " + std::to_string(i) + " of " + describe(*node) + ")");
    out = std::move(values);
  }

  // The first integer-array key whose value is not an array (a string, a number...), if any.
  struct NotAnArray {
    std::string key, where;
    bool is_string = false;
    std::string text;  // the string's text, or the value as TOML
  };
  const std::optional<NotAnArray>& not_an_array() const { return not_an_array_; }

  template <typename E, typename Fields>
  void table_array(const char* section, const char* name, std::vector<E>& items, const char*, Fields fields) {
    const toml::node* node = take(section, name);
    if (!node) return;
    const toml::array* array = node->as_array();
    MOE_CHECK(array && (array->empty() || array->is_array_of_tables()), where(section, name),
              " must be an array of tables ([[", dotted(section, name), "]] entries), got ", describe(*node));
    items.clear();
    for (size_t i = 0; i < array->size(); ++i) {
      ItemReader reader(*array->get(i)->as_table(), dotted(section, name) + "[" + std::to_string(i) + "]", source_);
      E item{};
      fields(item, reader);
      reader.reject_unknown();
      items.push_back(std::move(item));
    }
  }

  bool present(const std::string& dotted_key) const { return present_.count(dotted_key) != 0; }

  void reject_unknown() const {
    std::string sections;
    for (const auto& [s, keys] : known_)
      if (!s.empty()) sections += (sections.empty() ? "" : ", ") + s;
    for (auto&& [k, v] : root_) {
      const std::string key(k.str());
      if (!v.is_table()) {
        MOE_CHECK(known_.at("").count(key), "unknown top-level config key '", key, "' in ", source_);
        continue;
      }
      const auto it = known_.find(key);
      MOE_CHECK(it != known_.end() && !key.empty(), "unknown config section [", key, "] in ", source_,
                "; known sections: ", sections);
      for (auto&& [k2, v2] : *v.as_table()) {
        (void)v2;
        const std::string key2(k2.str());
        if (it->second.count(key2)) continue;
        std::string names;
        for (const auto& n : it->second) names += (names.empty() ? "" : ", ") + n;
        MOE_FAIL("unknown config key '", key, ".", key2, "' in ", source_, "; known keys in [", key, "]: ", names);
      }
    }
  }

 private:
  // Records `name` as a known key of `section` and returns its node, noting the key as present,
  // or nullptr when the file does not set it.
  const toml::node* take(const char* section, const char* name) {
    known_[section].insert(name);
    const toml::node* node = find(section, name);
    if (node) present_.insert(dotted(section, name));
    return node;
  }
  const toml::node* find(const char* section, const char* name) const {
    if (!*section) return root_.get(name);
    const toml::node* s = root_.get(section);
    if (!s) return nullptr;
    MOE_CHECK(s->is_table(), "config section '", section, "' in ", source_, " must be a table ([", section, "])");
    return s->as_table()->get(name);
  }
  std::string where(const char* section, const char* name) const {
    return "config key '" + dotted(section, name) + "' in " + source_;
  }
  const toml::table& root_;
  std::string source_;
  std::map<std::string, std::set<std::string>> known_;
  std::set<std::string> present_;
  std::optional<NotAnArray> not_an_array_;
};

// An example value for an integer-array key that is valid for config `c`: for parallel.pp_layers
// the layer counts of the user's string when they split this model, else the balanced split (none
// when pp x pp_virtual chunks cannot split the layers); for another key, the string's integers.
std::optional<std::vector<int64_t>> array_example(const std::string& key,
                                                  const std::optional<std::vector<int64_t>>& own, const Config& c) {
  if (key != "parallel.pp_layers") return own;
  const int64_t chunks = c.parallel.pp * c.parallel.pp_virtual, layers = c.model.num_hidden_layers;
  if (c.parallel.pp < 1 || c.parallel.pp_virtual < 1 || chunks > layers) return std::nullopt;
  if (own && own->empty()) return own;  // [], the balanced split
  if (own && static_cast<int64_t>(own->size()) == chunks &&
      std::all_of(own->begin(), own->end(), [](int64_t n) { return n >= 1; }) &&
      std::accumulate(own->begin(), own->end(), int64_t{0}) == layers)
    return own;
  const PipelineLayout balanced = plan_pipeline_layout(c.model, c.train.seq_len, static_cast<int>(c.parallel.pp),
                                                       static_cast<int>(c.parallel.pp_virtual));
  std::vector<int64_t> sizes;
  for (int k = 0; k < balanced.chunks(); ++k) sizes.push_back(balanced.end_layer(k) - balanced.first_layer(k));
  return sizes;
}

// An integer-array key given something else: what it got, what it takes and a valid example.
std::string not_an_array_message(const TomlReader::NotAnArray& bad, const Config& c) {
  std::string msg = bad.where + " must be an array of integers, " +
                    (bad.is_string ? "not the string \"" + bad.text + "\"" : "got " + bad.text);
  if (bad.key == "parallel.pp_layers") {
    const int64_t chunks = c.parallel.pp * c.parallel.pp_virtual, layers = c.model.num_hidden_layers;
    msg += "; it takes one layer count per pipeline chunk (parallel.pp x parallel.pp_virtual = " +
           std::to_string(chunks) + ")";
    msg += chunks <= layers ? " adding up to model.num_hidden_layers = " + std::to_string(layers) +
                                  ", or [] for the split balanced by cost"
                            : ", but the " + std::to_string(chunks) + " chunks exceed model.num_hidden_layers = " +
                                  std::to_string(layers) + ": lower parallel.pp or parallel.pp_virtual";
  }
  const auto example =
      array_example(bad.key, bad.is_string ? integers_in_string(bad.text) : std::nullopt, c);
  if (example)
    msg += ": write " + bad.key + " = " + integers_text(*example) + " (on the command line: --set '" + bad.key + "=" +
           integers_text(*example, ",") + "')";
  return msg;
}

// One item of an array of tables as a TOML table.
struct ItemWriter {
  toml::table table;
  template <typename T>
  void key(const char* field, const T& value, const Range<T>&, const char*) {
    if constexpr (std::is_same_v<T, uint64_t>)
      table.insert_or_assign(field, static_cast<int64_t>(value));
    else
      table.insert_or_assign(field, value);
  }
};

// Builds the resolved config as a TOML table (toml++ quotes and escapes every string).
class TomlWriter {
 public:
  explicit TomlWriter(const std::string& only_section = "*") : only_(only_section) {}

  template <typename T>
  void key(const char* section, const char* name, const T& value, const Range<T>&, const char*) {
    if (!wanted(section)) return;
    if constexpr (std::is_same_v<T, uint64_t>)
      put(section, name, static_cast<int64_t>(value));
    else
      put(section, name, value);
  }
  template <typename E>
  void choice(const char* section, const char* name, const E& value, const Choices<E>& choices, const char*) {
    if (wanted(section)) put(section, name, choice_name(choices, value));
  }
  void integer_array(const char* section, const char* name, const std::vector<int64_t>& values,
                     const Range<int64_t>&, const char*) {
    if (!wanted(section)) return;
    toml::array array;
    for (int64_t v : values) array.push_back(v);
    put(section, name, std::move(array));
  }
  template <typename E, typename Fields>
  void table_array(const char* section, const char* name, const std::vector<E>& items, const char*, Fields fields) {
    if (!wanted(section) || items.empty()) return;
    toml::array array;
    for (const E& item : items) {
      ItemWriter w;
      fields(item, w);
      array.push_back(std::move(w.table));
    }
    put(section, name, std::move(array));
  }
  std::string text() const {
    std::ostringstream os;
    os << root_ << "\n";
    return os.str();
  }

 private:
  bool wanted(const char* section) const { return only_ == "*" || only_ == section; }
  template <typename T>
  void put(const char* section, const char* name, T&& value) {
    if (!*section) {
      root_.insert_or_assign(name, std::forward<T>(value));
      return;
    }
    if (!root_.get(section)) root_.insert_or_assign(section, toml::table{});
    root_.get_as<toml::table>(section)->insert_or_assign(name, std::forward<T>(value));
  }

  std::string only_;
  toml::table root_;
};

// The fields of one item of an array of tables, handed to a visitor's key() as keys of the
// "section" <name>[i] (so they are named data.sources[0].path in listings and messages).
template <typename V>
struct ItemAsSection {
  V& visitor;
  std::string section;
  template <typename T>
  void key(const char* name, const T& field, const Range<T>& range, const char* doc) {
    visitor.key(section.c_str(), name, field, range, doc);
  }
};

// (dotted key, canonical value text) in table order: what the resume and rank-agreement
// comparisons compare (values, not the layout of a file).
class ValueLister {
 public:
  template <typename T>
  void key(const char* section, const char* name, const T& value, const Range<T>&, const char*) {
    std::ostringstream os;
    os.precision(17);
    if constexpr (std::is_same_v<T, bool>)
      os << (value ? "true" : "false");
    else if constexpr (std::is_same_v<T, std::string>)
      os << toml::value<std::string>(value);
    else
      os << value;
    values.emplace_back(dotted(section, name), os.str());
  }
  template <typename E>
  void choice(const char* section, const char* name, const E& value, const Choices<E>& choices, const char*) {
    values.emplace_back(dotted(section, name), "\"" + choice_name(choices, value) + "\"");
  }
  void integer_array(const char* section, const char* name, const std::vector<int64_t>& items, const Range<int64_t>&,
                     const char*) {
    values.emplace_back(dotted(section, name), integers_text(items));
  }
  template <typename E, typename Fields>
  void table_array(const char* section, const char* name, const std::vector<E>& items, const char*, Fields fields) {
    values.emplace_back(dotted(section, name), std::to_string(items.size()) + " entries");
    for (size_t i = 0; i < items.size(); ++i) {
      ItemAsSection<ValueLister> item{*this, dotted(section, name) + "[" + std::to_string(i) + "]"};
      fields(items[i], item);
    }
  }
  std::vector<std::pair<std::string, std::string>> values;
};

// One markdown row per key: name, type, default, accepted values, meaning.
class KeyDocumenter {
 public:
  template <typename T>
  void key(const char* section, const char* name, const T& value, const Range<T>& range, const char* doc) {
    std::ostringstream def;
    def.precision(6);
    if constexpr (std::is_same_v<T, bool>)
      def << (value ? "true" : "false");
    else if constexpr (std::is_same_v<T, std::string>)
      def << "\"" << value << "\"";
    else
      def << value;
    const char* type = std::is_same_v<T, bool>          ? "bool"
                       : std::is_same_v<T, std::string> ? "string"
                       : std::is_floating_point_v<T>    ? "float"
                                                        : "integer";
    row(section, name, type, def.str(), range_text(range), doc);
  }
  template <typename E>
  void choice(const char* section, const char* name, const E& value, const Choices<E>& choices, const char* doc) {
    row(section, name, "string", "\"" + choice_name(choices, value) + "\"", "one of: " + choice_names(choices), doc);
  }
  void integer_array(const char* section, const char* name, const std::vector<int64_t>& value,
                     const Range<int64_t>& range, const char* doc) {
    row(section, name, "array of integers", integers_text(value), "each " + range_text(range), doc);
  }
  template <typename E, typename Fields>
  void table_array(const char* section, const char* name, const std::vector<E>&, const char* doc, Fields fields) {
    row(section, name, "array of tables", "[]", "[[" + dotted(section, name) + "]] entries with the keys below", doc);
    const E defaults{};
    ItemAsSection<KeyDocumenter> item{*this, dotted(section, name) + "[]"};
    fields(defaults, item);
  }
  std::string text = "| key | type | default | accepted | meaning |\n|---|---|---|---|---|\n";

 private:
  void row(const char* section, const char* name, const char* type, const std::string& def, const std::string& accepted,
           const char* doc) {
    text += "| `" + dotted(section, name) + "` | " + type + " | `" + def + "` | " + accepted + " | " + doc + " |\n";
  }
};

// One value at a time: the same ranges the reader applies, for configs built in code.
struct RangeCheck {
  template <typename T>
  void key(const char* section, const char* name, const T& v, const Range<T>& r, const char*) {
    if constexpr (!std::is_same_v<T, bool> && !std::is_same_v<T, std::string>)
      MOE_CHECK(in_range(r, v), dotted(section, name), " must be ", std::is_floating_point_v<T> ? "a finite number " : "",
                range_text(r), ", got ", v);
  }
  template <typename E>
  void choice(const char* section, const char* name, const E& v, const Choices<E>& choices, const char*) {
    bool found = false;
    for (const auto& c : choices) found = found || c.second == v;
    MOE_CHECK(found, dotted(section, name), " is not one of: ", choice_names(choices));
  }
  void integer_array(const char* section, const char* name, const std::vector<int64_t>& v, const Range<int64_t>& r,
                     const char*) {
    for (size_t i = 0; i < v.size(); ++i)
      MOE_CHECK(in_range(r, v[i]), dotted(section, name), " = ", integers_text(v), ": element ", i, " must be ",
                range_text(r), ", got ", v[i]);
  }
  template <typename E, typename Fields>
  void table_array(const char* section, const char* name, const std::vector<E>& items, const char*, Fields fields) {
    for (size_t i = 0; i < items.size(); ++i) {
      ItemAsSection<RangeCheck> item{*this, dotted(section, name) + "[" + std::to_string(i) + "]"};
      fields(items[i], item);
    }
  }
};

toml::table parse_toml(const std::string& text, const std::string& source) {
  try {
    return toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    MOE_FAIL("malformed TOML in ", source, " at line ", where.line, ", column ", where.column, ": ",
             std::string(e.description()));
  }
}

// "section.key=value": the value is parsed as a TOML value; a bare word becomes a string.
void apply_override(toml::table& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  MOE_CHECK(eq != std::string::npos && eq > 0, "--set expects section.key=value, got '", assignment, "'");
  const std::string path = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
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

// a x b x ... as int64, or an error naming the factors and what the product is used for.
int64_t checked_product(const std::vector<std::pair<std::string, int64_t>>& factors, const char* what,
                        int64_t limit = std::numeric_limits<int64_t>::max()) {
  int64_t p = 1;
  bool overflow = false;
  std::string names;
  for (const auto& [name, v] : factors) {
    names += (names.empty() ? "" : " x ") + name + " (" + std::to_string(v) + ")";
    overflow = overflow || v < 0 || __builtin_mul_overflow(p, v, &p);
  }
  MOE_CHECK(!overflow && p <= limit, what, " = ", names, overflow ? " does not fit in 64 bits" : " = ",
            overflow ? "" : std::to_string(p), overflow ? "" : " exceeds the limit of " + std::to_string(limit),
            "; lower one of these keys");
  return p;
}

// A stored config's keys in the form older versions wrote, rewritten to today's form:
// parallel.pp_layers = "3,1" (a comma-separated string before it became an array). A string that
// is not a list of integers is left for the reader to refuse.
void read_older_stored_forms(toml::table& root) {
  toml::table* parallel = root.get_as<toml::table>("parallel");
  toml::node* layers = parallel ? parallel->get("pp_layers") : nullptr;
  if (!layers || !layers->is_string()) return;
  const auto values = integers_in_string(*layers->value<std::string>());
  if (!values) return;
  toml::array array;
  for (int64_t v : *values) array.push_back(v);
  parallel->insert_or_assign("pp_layers", std::move(array));
}

Config parse_config_text(const std::string& toml_text, const std::string& source_name,
                         const std::vector<std::string>& overrides, bool validate, bool stored) {
  toml::table root = parse_toml(toml_text, source_name);
  if (stored) read_older_stored_forms(root);
  for (const auto& o : overrides) apply_override(root, o);
  const std::string source = overrides.empty() ? source_name : source_name + " (with --set overrides)";
  TomlReader reader(root, source);
  Config c;
  visit_config_keys(c, reader);
  // Keys whose default follows another key (as in OlmoeConfig).
  if (!reader.present("model.num_key_value_heads")) c.model.num_key_value_heads = c.model.num_attention_heads;
  if (!reader.present("model.eos_token_id")) c.model.eos_token_id = c.model.vocab_size - 1;
  MOE_CHECK(!(reader.present("data.path") && !c.data.sources.empty()), "config ", source,
            " gives both data.path and [[data.sources]]: use data.path for one source or [[data.sources]] for several, "
            "not both");
  reader.reject_unknown();
  if (reader.not_an_array()) MOE_FAIL(not_an_array_message(*reader.not_an_array(), c));
  if (validate) c.validate();
  return c;
}

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides, bool validate) {
  return parse_config_text(toml_text, source_name, overrides, validate, /*stored=*/false);
}

Config parse_stored_config(const std::string& toml_text, const std::string& source_name,
                           const std::vector<std::string>& overrides, bool validate) {
  return parse_config_text(toml_text, source_name, overrides, validate, /*stored=*/true);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  MOE_CHECK(!path.empty(), "--config is empty: give a .toml file, or 'tiny' for the built-in config");
  if (path == "tiny") return parse_config(builtin::kTinyToml, "built-in config 'tiny'", overrides);
  std::error_code ec;
  MOE_CHECK(fs::exists(path, ec), "config file '", path, "' does not exist (--config)");
  MOE_CHECK(fs::is_regular_file(path, ec), "config file '", path, "' is not a regular file (--config takes a .toml file)");
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "cannot read config file '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  MOE_CHECK(!in.bad(), "cannot read config file '", path, "'");
  return parse_config(ss.str(), path, overrides);
}

double parse_duration(const std::string& text, const std::string& key) {
  if (text.empty()) return 0;
  double total = 0;
  size_t i = 0;
  bool any = false;
  while (i < text.size()) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(text.substr(i), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MOE_CHECK(used > 0 && std::isfinite(v) && v >= 0, key, " = \"", text,
              "\" is not a duration; write e.g. \"4h\", \"1h30m\", \"45m\" or \"90s\"");
    i += used;
    double unit = 1;
    if (i < text.size()) {
      const char u = text[i++];
      unit = u == 's' ? 1 : u == 'm' ? 60 : u == 'h' ? 3600 : u == 'd' ? 86400 : -1;
      MOE_CHECK(unit > 0, key, " = \"", text, "\": unknown unit '", u, "' (use s, m, h or d)");
    } else {
      MOE_CHECK(!any, key, " = \"", text, "\": a unit (s, m, h or d) must follow every number but the only one");
    }
    total += v * unit;
    any = true;
  }
  MOE_CHECK(total > 0, key, " = \"", text, "\" must be longer than zero (\"\" means no limit)");
  // The deadline is kept in the steady clock's nanoseconds (int64: ~292 years); a longer one
  // would wrap around into the past and stop the run at its first step.
  constexpr double kLongest = 100.0 * 365 * 86400;
  MOE_CHECK(total <= kLongest, key, " = \"", text, "\" is longer than 100 years; \"\" means no limit");
  return total;
}

int64_t ParallelConfig::dp(int64_t world) const {
  if (world % pp != 0) {
    std::string divisors;
    for (int64_t d = 1; d <= world; ++d)
      if (world % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
    MOE_FAIL("parallel.pp = ", pp, " does not divide the ", world, " ranks; use one of ", divisors);
  }
  return world / pp;
}

void Config::validate(int64_t dp) const {
  visit_config_keys(*this, RangeCheck{});
  parse_duration(train.max_duration, "train.max_duration");
  // A peak this small (a denormal, say) would print an MFU of inf%; no device is that slow.
  MOE_CHECK(run.peak_tflops == 0 || run.peak_tflops >= 1e-6, "run.peak_tflops = ", run.peak_tflops,
            " is not a device's peak: give its TFLOP/s (at least 1e-6), or 0 for the device's default");
  // The name becomes a folder (runs/<name>) when run.dir is empty.
  MOE_CHECK(!name.empty() && name != "." && name != ".." &&
                name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") ==
                    std::string::npos,
            "name = \"", name, "\" must be a plain folder name (letters, digits, '.', '_', '-'): run.dir defaults to "
            "runs/<name>");
  MOE_CHECK(run.dir.empty() || run.dir[0] != '~', "run.dir = \"", run.dir,
            "\" starts with '~', which is not expanded (no shell reads the config); write the full path");
  MOE_CHECK(data.sources.empty() || data.path == "synthetic" || data.path.empty(),
            "data.path and [[data.sources]] are both given: use one of them, not both");
  MOE_CHECK(!data.path.empty() || !data.sources.empty(), "data.path is empty: give token files, a folder, a glob or "
            "\"synthetic\"");
  for (size_t i = 0; i < data.sources.size(); ++i)
    MOE_CHECK(!data.sources[i].path.empty(), "data.sources[", i, "].path is missing or empty");
  for (size_t i = 0; i < eval.sets.size(); ++i) {
    MOE_CHECK(!eval.sets[i].name.empty() && !eval.sets[i].path.empty(), "eval.sets[", i,
              "] needs a name and a path");
    for (size_t j = 0; j < i; ++j)
      MOE_CHECK(eval.sets[j].name != eval.sets[i].name, "eval.sets: the name '", eval.sets[i].name, "' is used twice");
  }
  model.validate();
  const TrainConfig& t = train;
  MOE_CHECK(dp >= 1, "data-parallel ranks must be >= 1, got ", dp);
  // Size products the run forms, checked before anything multiplies them. Route indices and
  // expert-buffer rows are 32-bit on the device: tokens x top-K x capacity x EP stays below 2^31.
  const int64_t micro_tokens =
      checked_product({{"train.micro_batch_size", t.micro_batch_size}, {"train.seq_len", t.seq_len}},
                      "tokens per microbatch", int64_t{1} << 31);
  checked_product({{"train.global_batch_size", t.global_batch_size}, {"train.seq_len", t.seq_len}}, "tokens per step",
                  int64_t{1} << 53);
  MOE_CHECK(t.global_batch_size % t.micro_batch_size == 0 && (t.global_batch_size / t.micro_batch_size) % dp == 0,
            "train.global_batch_size (", t.global_batch_size, ") must be a positive multiple of train.micro_batch_size (",
            t.micro_batch_size, ")",
            // Checked once at load time with one rank (the job's count is not known yet), then with the real one.
            dp > 1 ? " x data-parallel ranks (" + std::to_string(dp) + ")"
                   : std::string(" (x the data-parallel ranks)"));
  const double expert_rows = std::ceil(model.capacity_factor * static_cast<double>(micro_tokens) *
                                       static_cast<double>(model.num_experts_per_tok)) *
                             static_cast<double>(parallel.ep);
  MOE_CHECK(expert_rows < 2147483648.0, "expert-buffer rows ceil(model.capacity_factor (", model.capacity_factor,
            ") x tokens per microbatch (", micro_tokens, ") x model.num_experts_per_tok (", model.num_experts_per_tok,
            ")) x parallel.ep (", parallel.ep, ") = ", expert_rows,
            " must stay below 2^31 (32-bit route indices); lower train.micro_batch_size or train.seq_len");
  checked_product({{"model.vocab_size", model.vocab_size}, {"model.hidden_size", model.hidden_size}},
                  "embedding elements", int64_t{1} << 40);
  checked_product({{"model.num_experts", model.num_experts},
                   {"model.intermediate_size", model.intermediate_size},
                   {"model.hidden_size", model.hidden_size},
                   {"model.num_hidden_layers", model.num_hidden_layers}},
                  "expert weight elements", int64_t{1} << 44);
  checked_product({{"tokens per microbatch", micro_tokens}, {"model.hidden_size", model.hidden_size}},
                  "activation elements per microbatch row block", int64_t{1} << 44);
  MOE_CHECK(parallel.mode != "fsdp" || parallel.ep == 1,
            "parallel.mode = \"fsdp\" holds every expert on every rank (no expert parallelism); set parallel.ep = 1");
  MOE_CHECK(!t.cuda_graph || run.device != "cpu", "train.cuda_graph = true needs the GPU, but run.device = \"cpu\"");
  const ParallelConfig& par = parallel;
  if (par.pp > 1) {
    MOE_CHECK(par.mode == "ddp", "parallel.pp = ", par.pp, " is built for parallel.mode = \"ddp\", not \"",
              par.mode, "\"; use parallel.mode = \"ddp\" or parallel.pp = 1");
    // The executor follows its op list on the host (which chunk, which activation set, which
    // message): a captured step would have to be one graph per rank, built from that list (not built).
    MOE_CHECK(!t.cuda_graph, "parallel.pp = ", par.pp, " runs its schedule eagerly; set train.cuda_graph = false or "
              "parallel.pp = 1");
  }
  MOE_CHECK(par.pp_virtual == 1 || (par.pp_schedule == "interleaved" && par.pp > 1), "parallel.pp_virtual = ",
            par.pp_virtual, " needs parallel.pp_schedule = \"interleaved\" and parallel.pp >= 2; use "
            "parallel.pp_virtual = 1");
  MOE_CHECK(par.pp_schedule != "interleaved" || par.pp > 1, "parallel.pp_schedule = \"interleaved\" needs "
            "parallel.pp >= 2 (one stage has nothing to interleave); use parallel.pp_schedule = \"1f1b\"");
  // One chunk per rank is the 1F1B schedule: asked for interleaving, the run would silently not interleave.
  MOE_CHECK(par.pp_schedule != "interleaved" || par.pp_virtual > 1, "parallel.pp_schedule = \"interleaved\" needs "
            "parallel.pp_virtual >= 2 chunks per rank (with 1 it is the 1F1B schedule); set parallel.pp_virtual, or "
            "use parallel.pp_schedule = \"1f1b\"");
  // Given chunk sizes must match the chunk count and the layers: refused here, before any rank starts.
  if (!par.pp_layers.empty())
    plan_pipeline_layout(model, t.seq_len, static_cast<int>(par.pp), static_cast<int>(par.pp_virtual), par.pp_layers);
  // FSDP holds a block's weights only between its gather and its release: an FP8 cache per step
  // would have to be gathered with them (not built).
  MOE_CHECK(t.precision != Precision::FP8 || parallel.mode != "fsdp",
            "train.precision = \"fp8\" is built for parallel.mode = \"ddp\" (resident weights with their FP8 "
            "caches), not for \"fsdp\"; use parallel.mode = \"ddp\" or train.precision = \"bf16\"");
  // The moved FP8 rows are the expert GEMM's operand: a BF16 product would dequantize them again.
  MOE_CHECK(ep.payload != Payload::FP8 || t.precision == Precision::FP8,
            "ep.payload = \"fp8\" moves the FP8 operand of the expert GEMM and needs train.precision = \"fp8\"; "
            "set train.precision = \"fp8\" or ep.payload = \"bf16\"");
  MOE_CHECK(ep.payload != Payload::FP8 || parallel.ep == 1 || ep.backend == "rowwise",
            "ep.payload = \"fp8\" is built for ep.backend = \"rowwise\" (the alltoall baseline moves BF16 rows); "
            "set ep.backend = \"rowwise\" or ep.payload = \"bf16\"");
}

std::string model_config_toml(const ModelConfig& m) {
  Config c;
  c.model = m;
  TomlWriter w("model");
  visit_config_keys(std::as_const(c), w);
  return w.text();
}

std::string config_to_toml(const Config& c) {
  TomlWriter w;
  visit_config_keys(c, w);
  return w.text();
}

std::vector<std::pair<std::string, std::string>> config_values(const Config& c) {
  ValueLister l;
  visit_config_keys(c, l);
  return l.values;
}

std::string config_differences(const Config& a, const Config& b, const std::string& section, const std::string& a_label,
                               const std::string& b_label) {
  const auto va = config_values(a), vb = config_values(b);
  const std::map<std::string, std::string> in_b(vb.begin(), vb.end()), in_a(va.begin(), va.end());
  auto wanted = [&](const std::string& key) { return section.empty() || key.rfind(section + ".", 0) == 0; };
  std::string out;
  auto line = [&](const std::string& key, const std::string& x, const std::string& y) {
    out += "\n  " + a_label + ": " + key + " = " + x + "\n  " + b_label + ": " + key + " = " + y;
  };
  for (const auto& [key, value] : va) {
    if (!wanted(key)) continue;
    const auto it = in_b.find(key);
    if (it == in_b.end() || it->second != value) line(key, value, it == in_b.end() ? "(none)" : it->second);
  }
  for (const auto& [key, value] : vb)
    if (wanted(key) && !in_a.count(key)) line(key, "(none)", value);
  return out;
}

std::string config_keys_markdown() {
  const Config defaults;
  KeyDocumenter d;
  visit_config_keys(defaults, d);
  return d.text;
}

void check_fp8_gpu_shapes(const Config& c) {
  const ModelConfig& m = c.model;
  const auto need16 = [](int64_t v, const std::string& what) {
    MOE_CHECK(v % 16 == 0, "train.precision = \"fp8\" on the GPU needs ", what, " to be a multiple of 16 (the FP8 "
              "matmuls read 16-byte rows of codes); it is ", v, ". Change it, set train.precision = \"bf16\", or run "
              "on the CPU (run.device = \"cpu\"; plan --device cpu), where FP8 is emulated with no such limit");
  };
  need16(m.hidden_size, "model.hidden_size");
  need16(m.num_attention_heads * m.head_dim(), "model.num_attention_heads x head dim (the query width)");
  need16(m.num_key_value_heads * m.head_dim(), "model.num_key_value_heads x head dim (the key and value width)");
  if (m.num_hidden_layers > m.first_k_dense_replace) need16(m.intermediate_size, "model.intermediate_size");
  if (m.shared_expert_intermediate_size > 0)
    need16(m.shared_expert_intermediate_size, "model.shared_expert_intermediate_size");
  if (m.first_k_dense_replace > 0) need16(m.dense_intermediate_size, "model.dense_intermediate_size");
  need16(c.train.micro_batch_size * c.train.seq_len,
         "train.micro_batch_size x train.seq_len (" + std::to_string(c.train.micro_batch_size) + " x " +
             std::to_string(c.train.seq_len) + ", the tokens of a microbatch)");
}

}  // namespace moe

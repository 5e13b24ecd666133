#include "moe/train/config_reader.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "moe/core/error.h"
#include "moe/train/config_key_text.h"
#include "moe/train/config_keys.h"
#include "moe/train/pipeline_layout.h"

namespace moe {
namespace {

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
    MOE_FAIL(dotted_key(section, name), " = \"", text, "\" is not one of: ", choice_names(choices), " (config key in ",
             source_, ")");
  }

  void integer_array(const char* section, const char* name, std::vector<int64_t>& out, const Range<int64_t>& range,
                     const char*) {
    const toml::node* node = take(section, name);
    if (!node) return;
    if (!node->is_array()) {
      // Reported once every key is read, with an example that is valid for the configured model.
      if (!not_an_array_) {
        not_an_array_ = NotAnArray{dotted_key(section, name), where(section, name), node->is_string(), describe(*node)};
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
              " must be an array of tables ([[", dotted_key(section, name), "]] entries), got ", describe(*node));
    items.clear();
    for (size_t i = 0; i < array->size(); ++i) {
      ItemReader reader(*array->get(i)->as_table(), dotted_key(section, name) + "[" + std::to_string(i) + "]", source_);
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
    if (node) present_.insert(dotted_key(section, name));
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
    return "config key '" + dotted_key(section, name) + "' in " + source_;
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

}  // namespace

Config read_config_table(const toml::table& root, const std::string& source) {
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
  return c;
}

}  // namespace moe

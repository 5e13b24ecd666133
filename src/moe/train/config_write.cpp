// The config written out: as TOML text (the run folder's config.toml, a checkpoint's stored config),
// as (key, value) pairs and the differences between two configs (resume and rank-agreement checks),
// and as the markdown key table (`moetrain keys`, README.md). Each is a visitor of config_keys.h.
#include <charconv>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <toml++/toml.h>

#include "moe/train/config.h"
#include "moe/train/config_key_text.h"
#include "moe/train/config_keys.h"

namespace moe {
namespace {

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

// (dotted key, canonical value text) in table order: what the resume and rank-agreement
// comparisons compare (values, not the layout of a file).
class ValueLister {
 public:
  template <typename T>
  void key(const char* section, const char* name, const T& value, const Range<T>&, const char*) {
    std::ostringstream os;
    if constexpr (std::is_same_v<T, bool>) {
      os << (value ? "true" : "false");
    } else if constexpr (std::is_same_v<T, std::string>) {
      os << toml::value<std::string>(value);
    } else if constexpr (std::is_floating_point_v<T>) {
      // The shortest text that reads back as the same value (1e-06, not 9.9999999999999995e-07),
      // in plain digits where they read best (500000, 0.003).
      char text[64];
      const T magnitude = value < 0 ? -value : value;
      const auto done = magnitude >= T(1e-4) && magnitude < T(1e15)
                            ? std::to_chars(text, text + sizeof text, value, std::chars_format::fixed)
                            : std::to_chars(text, text + sizeof text, value);
      os << std::string_view(text, static_cast<size_t>(done.ptr - text));
    } else {
      os << value;
    }
    values.emplace_back(dotted_key(section, name), os.str());
  }
  template <typename E>
  void choice(const char* section, const char* name, const E& value, const Choices<E>& choices, const char*) {
    values.emplace_back(dotted_key(section, name), "\"" + choice_name(choices, value) + "\"");
  }
  void integer_array(const char* section, const char* name, const std::vector<int64_t>& items, const Range<int64_t>&,
                     const char*) {
    values.emplace_back(dotted_key(section, name), integers_text(items));
  }
  template <typename E, typename Fields>
  void table_array(const char* section, const char* name, const std::vector<E>& items, const char*, Fields fields) {
    values.emplace_back(dotted_key(section, name), std::to_string(items.size()) + " entries");
    for (size_t i = 0; i < items.size(); ++i) {
      ItemAsSection<ValueLister> item{*this, dotted_key(section, name) + "[" + std::to_string(i) + "]"};
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
    row(section, name, "array of tables", "[]", "[[" + dotted_key(section, name) + "]] entries with the keys below",
        doc);
    const E defaults{};
    ItemAsSection<KeyDocumenter> item{*this, dotted_key(section, name) + "[]"};
    fields(defaults, item);
  }
  std::string text = "| key | type | default | accepted | meaning |\n|---|---|---|---|---|\n";

 private:
  void row(const char* section, const char* name, const char* type, const std::string& def, const std::string& accepted,
           const char* doc) {
    text += "| `" + dotted_key(section, name) + "` | " + type + " | `" + def + "` | " + accepted + " | " + doc + " |\n";
  }
};

}  // namespace

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
    out += (out.empty() ? " " : "; ") + key + " = " + x + " in " + a_label + ", " + y + " in " + b_label;
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

}  // namespace moe

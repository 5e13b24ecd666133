// What the visitors of the key table (config_keys.h) share: a key's dotted name, whether a value
// lies in its Range, and ranges, choices and integer arrays as the text that messages and the key
// listing show. The reader (config_reader.cpp), the writers (config_write.cpp) and the range check
// (config_validate.cpp) all use these, so a range is tested and described one way everywhere.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "moe/core/error.h"
#include "moe/train/config_keys.h"

namespace moe {

inline std::string dotted_key(const char* section, const char* name) {
  return *section ? std::string(section) + "." + name : std::string(name);
}

template <typename T>
std::string range_text(const Range<T>& r) {
  std::ostringstream os;
  os.precision(6);
  bool capped_count = false;
  if constexpr (std::is_integral_v<T>) capped_count = r.lo && r.hi && *r.hi == static_cast<T>(kMaxCount);
  if (capped_count) {
    // The cap on counts is a sanity bound against overflowing size products, not a real limit.
    os << ">= " << *r.lo << " (at most 2^40)";
  } else if (r.lo && r.hi) {
    os << "in " << (r.lo_open ? "(" : "[") << *r.lo << ", " << *r.hi << (r.hi_open ? ")" : "]");
  } else if (r.lo) {
    os << (r.lo_open ? "> " : ">= ") << *r.lo;
  } else if (r.hi) {
    os << (r.hi_open ? "< " : "<= ") << *r.hi;
  }
  if (r.zero_when) os << ", or 0 when " << r.zero_when;
  return os.str();
}

template <typename T>
bool in_range(const Range<T>& r, T v) {
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(v)) return false;
  if (r.zero_when && v == T{0}) return true;  // the condition is checked with the other keys
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
inline std::string integers_text(const std::vector<int64_t>& values, const char* separator = ", ") {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? separator : "") + std::to_string(values[i]);
  return s + "]";
}

// "3, 1" -> {3, 1}; "" -> {}; nullopt when a piece is not an integer. Reads the comma-separated
// string form an integer array once had, to show it as an array or to read an older stored config.
inline std::optional<std::vector<int64_t>> integers_in_string(const std::string& text) {
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

}  // namespace moe

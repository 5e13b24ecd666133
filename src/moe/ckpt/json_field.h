// Validated, typed reads of the fields of a JSON file (index.json, train_state.json, chunk
// records). Any mismatch (a missing field, a wrong type, a number out of range) is one moe::Error
// naming the file and the field as a JSON pointer (RFC 6901, e.g. /tensors/w1/chunks/2/begin),
// never a bare nlohmann::json exception that says neither.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace moe {

class JsonField {
 public:
  // The whole document read from `file`; `document` must outlive the fields taken from it.
  JsonField(const nlohmann::json& document, std::string file);

  const nlohmann::json& value() const { return *value_; }
  // "<file>: field /a/b", or "<file>: the top level" for the document.
  std::string name() const;

  bool has(const std::string& key) const;                          // an object holding member `key`
  JsonField operator[](const std::string& key) const;              // error unless an object holding `key`
  std::vector<JsonField> elements() const;                         // error unless an array
  std::vector<std::pair<std::string, JsonField>> members() const;  // error unless an object

  void expect_object() const;
  // An integer (not a float, not a string) within [min, max].
  int64_t as_int(int64_t min = std::numeric_limits<int64_t>::min(),
                 int64_t max = std::numeric_limits<int64_t>::max()) const;
  std::string as_string() const;
  std::vector<int64_t> as_int_array(int64_t min) const;  // every element an integer >= min

  // Throws "<file>: field /a/b must be <expected>, found <the value>".
  [[noreturn]] void fail(const std::string& expected) const;

 private:
  JsonField(const nlohmann::json* value, std::string file, nlohmann::json::json_pointer pointer);

  const nlohmann::json* value_;
  std::string file_;
  nlohmann::json::json_pointer pointer_;
};

}  // namespace moe

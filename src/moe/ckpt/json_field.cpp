#include "moe/ckpt/json_field.h"

#include "moe/core/error.h"

namespace moe {

using nlohmann::json;

namespace {

// A value as it appears in the file, shortened: enough to recognize it in an error message.
std::string excerpt(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr size_t kMax = 60;
  return s.size() <= kMax ? s : s.substr(0, kMax) + "...";
}

std::string int_range(int64_t min, int64_t max) {
  constexpr int64_t kLo = std::numeric_limits<int64_t>::min(), kHi = std::numeric_limits<int64_t>::max();
  if (min == kLo && max == kHi) return "an integer";
  if (max == kHi) return "an integer >= " + std::to_string(min);
  if (min == kLo) return "an integer <= " + std::to_string(max);
  return "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
}

}  // namespace

JsonField::JsonField(const json& document, std::string file) : value_(&document), file_(std::move(file)) {}

JsonField::JsonField(const json* value, std::string file, json::json_pointer pointer)
    : value_(value), file_(std::move(file)), pointer_(std::move(pointer)) {}

std::string JsonField::name() const {
  return pointer_.empty() ? file_ + ": the top level" : file_ + ": field " + pointer_.to_string();
}

void JsonField::fail(const std::string& expected) const {
  MOE_FAIL(name(), " must be ", expected, ", found ", excerpt(*value_));
}

void JsonField::expect_object() const {
  if (!value_->is_object()) fail("an object");
}

bool JsonField::has(const std::string& key) const { return value_->is_object() && value_->contains(key); }

JsonField JsonField::operator[](const std::string& key) const {
  expect_object();
  auto it = value_->find(key);
  json::json_pointer at = pointer_ / key;
  MOE_CHECK(it != value_->end(), file_, ": missing field ", at.to_string());
  return JsonField(&*it, file_, std::move(at));
}

std::vector<JsonField> JsonField::elements() const {
  if (!value_->is_array()) fail("an array");
  std::vector<JsonField> out;
  for (size_t i = 0; i < value_->size(); ++i) out.push_back(JsonField(&(*value_)[i], file_, pointer_ / i));
  return out;
}

std::vector<std::pair<std::string, JsonField>> JsonField::members() const {
  expect_object();
  std::vector<std::pair<std::string, JsonField>> out;
  for (const auto& [key, v] : value_->items()) out.emplace_back(key, JsonField(&v, file_, pointer_ / key));
  return out;
}

int64_t JsonField::as_int(int64_t min, int64_t max) const {
  int64_t v = 0;
  if (value_->is_number_unsigned()) {
    // Beyond int64 is out of any range we accept; report it as such rather than wrapping it.
    if (value_->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) fail(int_range(min, max));
    v = static_cast<int64_t>(value_->get<uint64_t>());
  } else if (value_->is_number_integer()) {
    v = value_->get<int64_t>();
  } else {
    fail(int_range(min, max));
  }
  if (v < min || v > max) fail(int_range(min, max));
  return v;
}

std::string JsonField::as_string() const {
  if (!value_->is_string()) fail("a string");
  return value_->get<std::string>();
}

std::vector<int64_t> JsonField::as_int_array(int64_t min) const {
  if (!value_->is_array()) fail("an array of integers >= " + std::to_string(min));
  std::vector<int64_t> out;
  for (const JsonField& e : elements()) out.push_back(e.as_int(min));
  return out;
}

}  // namespace moe

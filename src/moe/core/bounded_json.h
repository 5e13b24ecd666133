// Parsing the JSON of a file a user hands us, with its nesting bounded. nlohmann's parser keeps
// its own stack, but printing a value (an error message quoting it) and freeing it recurse once per
// level: a file holding 100000 '[' overflowed the stack there (a segfault instead of an error). No
// JSON file moetrain reads nests more than a few levels, so a file nesting past kMaxJsonDepth is
// refused while it is parsed, naming it. On request a key given twice in one object is refused
// too: nlohmann keeps the last of two equal keys silently, which in a safetensors header or an
// index's weight_map would hide which bytes or which file hold a tensor.
//
// NOTES: both checks are a first pass through nlohmann's SAX interface, which builds nothing,
// followed by a plain parse. They were a parse callback before, but nlohmann's callback parser
// scans all earlier members of an object or array each time a member object ends, so a safetensors
// header of 300000 tensors took minutes to parse; the two passes are linear.
#pragma once

#include <istream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "moe/core/error.h"

namespace moe {

inline constexpr int kMaxJsonDepth = 64;

// The first pass: refuses nesting past kMaxJsonDepth and, with unique_keys, a key given twice in
// one object. A syntax error ends the pass quietly; the plain parse after it reports it.
template <class Json>
class JsonStructureCheck : public nlohmann::json_sax<Json> {
 public:
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;

  JsonStructureCheck(const std::string& shown, bool unique_keys) : shown_(shown), unique_keys_(unique_keys) {}

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open();
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& key) override {
    if (unique_keys_)
      MOE_CHECK(keys_.back().insert(key).second, shown_, ": key '", key, "' appears twice in one object; keep one");
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    open();
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  void open() {
    if (++depth_ > kMaxJsonDepth)
      MOE_FAIL(shown_, " nests JSON arrays or objects more than ", kMaxJsonDepth,
               " levels deep; no file moetrain reads does: it is not the file it should be");
  }

  const std::string& shown_;
  const bool unique_keys_;
  int depth_ = 0;
  std::vector<std::set<std::string>> keys_;  // those of each open object, only with unique_keys_
};

// Json::parse(input) after the structure pass; `shown` names the file in the errors. `also` is the
// caller's own parse callback; allow_exceptions as in nlohmann's parse (the structure errors are
// thrown either way); unique_keys refuses a key given twice in one object. A stream is read whole
// first (both passes read the text).
template <class Json = nlohmann::json, class Input>
Json parse_bounded_json(Input&& input, const std::string& shown, typename Json::parser_callback_t also = nullptr,
                        bool allow_exceptions = true, bool unique_keys = false) {
  if constexpr (std::is_base_of_v<std::istream, std::remove_cvref_t<Input>>) {
    const std::string text{std::istreambuf_iterator<char>(input), std::istreambuf_iterator<char>()};
    return parse_bounded_json<Json>(text, shown, std::move(also), allow_exceptions, unique_keys);
  } else {
    JsonStructureCheck<Json> check(shown, unique_keys);
    Json::sax_parse(input, &check);
    return Json::parse(std::forward<Input>(input), std::move(also), allow_exceptions);
  }
}

// The same over [first, last) (a header inside a mapped file).
template <class Json = nlohmann::json, class It>
Json parse_bounded_json_range(It first, It last, const std::string& shown, bool unique_keys = false) {
  JsonStructureCheck<Json> check(shown, unique_keys);
  Json::sax_parse(first, last, &check);
  return Json::parse(first, last);
}

}  // namespace moe

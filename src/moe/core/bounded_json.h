// Parsing the JSON of a file a user hands us, with its nesting bounded. nlohmann's parser keeps
// its own stack, but printing a value (an error message quoting it) and freeing it recurse once per
// level: a file holding 100000 '[' overflowed the stack there (a segfault instead of an error). No
// JSON file moetrain reads nests more than a few levels, so a file nesting past kMaxJsonDepth is
// refused while it is parsed, naming it.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "moe/core/error.h"

namespace moe {

inline constexpr int kMaxJsonDepth = 64;

// The parse callback that refuses nesting past kMaxJsonDepth, then runs `also` (if any).
template <class Json>
typename Json::parser_callback_t depth_bound(const std::string& shown, typename Json::parser_callback_t also) {
  return [shown, also](int depth, typename Json::parse_event_t event, Json& parsed) {
    if (depth >= kMaxJsonDepth)  // depth counts the levels outside the current one
      MOE_FAIL(shown, " nests JSON arrays or objects more than ", kMaxJsonDepth,
               " levels deep; no file moetrain reads does: it is not the file it should be");
    return also ? also(depth, event, parsed) : true;
  };
}

// A parse callback that refuses a key given twice in one object, naming it: nlohmann keeps the
// last of two equal keys silently, which in a safetensors header or an index's weight_map would
// hide which bytes or which file hold a tensor. Pass it as `also` below.
template <class Json = nlohmann::json>
typename Json::parser_callback_t refuse_duplicate_keys(const std::string& shown) {
  auto keys_of_open_objects = std::make_shared<std::vector<std::set<std::string>>>();
  return [shown, keys_of_open_objects](int /*depth*/, typename Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      keys_of_open_objects->emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      keys_of_open_objects->pop_back();
    } else if (event == Json::parse_event_t::key) {
      const std::string& key = parsed.template get_ref<const std::string&>();
      MOE_CHECK(keys_of_open_objects->back().insert(key).second, shown, ": key '", key,
                "' appears twice in one object; keep one");
    }
    return true;
  };
}

// Json::parse(input) with the depth bound; `shown` names the file in the error. `also` is the
// caller's own parse callback (run after the bound); allow_exceptions as in nlohmann's parse (the
// depth error is thrown either way).
template <class Json = nlohmann::json, class Input>
Json parse_bounded_json(Input&& input, const std::string& shown, typename Json::parser_callback_t also = nullptr,
                        bool allow_exceptions = true) {
  return Json::parse(std::forward<Input>(input), depth_bound<Json>(shown, also), allow_exceptions);
}

// The same over [first, last) (a header inside a mapped file).
template <class Json = nlohmann::json, class It>
Json parse_bounded_json_range(It first, It last, const std::string& shown,
                              typename Json::parser_callback_t also = nullptr) {
  return Json::parse(first, last, depth_bound<Json>(shown, also));
}

}  // namespace moe

// parse_bounded_json (core/bounded_json.h): nesting up to kMaxJsonDepth parses, deeper is one
// error naming the file, and a depth that would overflow the stack where the value is printed or
// freed (100000 levels) is refused the same way instead of crashing.
#include <gtest/gtest.h>

#include <string>

#include "moe/core/bounded_json.h"

namespace moe {
namespace {

std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(BoundedJson, NestingUpToTheBoundParsesDeeperIsRefusedNamingTheFile) {
  EXPECT_NO_THROW(parse_bounded_json(nested(kMaxJsonDepth), "a.json"));
  for (int depth : {kMaxJsonDepth + 1, 100000}) {
    try {
      parse_bounded_json(nested(depth), "a.json");
      ADD_FAILURE() << "depth " << depth << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("a.json nests JSON"), std::string::npos) << e.what();
    }
  }
  const std::string deep_key = "{\"files\": " + nested(100000) + "}";
  EXPECT_THROW(parse_bounded_json<nlohmann::ordered_json>(deep_key, "dataset.json"), Error);
  EXPECT_THROW(parse_bounded_json_range(deep_key.begin(), deep_key.end(), "header"), Error);
  // The caller's own callback still runs, and plain JSON is untouched.
  int keys = 0;
  const nlohmann::json j = parse_bounded_json(std::string(R"({"a": 1, "b": [2, 3]})"), "b.json",
                                              [&](int, nlohmann::json::parse_event_t event, nlohmann::json&) {
                                                keys += event == nlohmann::json::parse_event_t::key;
                                                return true;
                                              });
  EXPECT_EQ(keys, 2);
  EXPECT_EQ(j["b"][1], 3);
}

}  // namespace
}  // namespace moe

// The message of the moe::Error that `f` throws, or "" when it throws none: the tests check
// refusals by what they say (the key, the file, the fix).
#pragma once

#include <functional>
#include <string>

#include "moe/core/error.h"

namespace moe::testing {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace moe::testing

#include "moe/core/error.h"

#include <cstring>

namespace moe::detail {

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  throw Error(concat(msg, " (at ", base ? base + 1 : file, ":", line, ")"));
}

}  // namespace moe::detail

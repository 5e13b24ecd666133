#include "moe/core/error.h"

#include <cstring>

namespace moe::detail {

namespace {
std::string located(const char* file, int line, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  return concat(msg, " (at ", base ? base + 1 : file, ":", line, ")");
}
}  // namespace

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(located(file, line, msg));
}

[[noreturn]] void throw_agreed_error(const char* file, int line, const std::string& msg) {
  throw AgreedError(located(file, line, msg));
}

}  // namespace moe::detail

// Errors with context. MOE_CHECK(cond, parts...) throws moe::Error carrying file:line and a
// message assembled from the parts, so every failure names what went wrong and where.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace moe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace moe

// Throws moe::Error("<msg> (at file:line)") when cond is false.
#define MOE_CHECK(cond, ...)                                                            \
  do {                                                                                  \
    if (!(cond)) ::moe::detail::throw_error(__FILE__, __LINE__, ::moe::detail::concat(__VA_ARGS__)); \
  } while (0)

// Unconditional failure with a message.
#define MOE_FAIL(...) ::moe::detail::throw_error(__FILE__, __LINE__, ::moe::detail::concat(__VA_ARGS__))

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

// An error every rank of the job throws at the same point with the same text, because it is
// decided from values all ranks share (a broadcast, a reduction, gathered records). The job prints
// it once and every rank exits 1, where an Error ends the job by MPI_Abort with one line per rank
// that got there first. Throw it only where no rank can decide otherwise: a rank waiting in a
// collective for a rank that threw it would wait for ever.
class AgreedError : public Error {
 public:
  explicit AgreedError(const std::string& what) : Error(what) {}
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_agreed_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace moe

// Throws moe::Error("<msg> (at file:line)") when cond is false.
#define MOE_CHECK(cond, ...)                                                                         \
  do {                                                                                               \
    if (!(cond)) ::moe::detail::throw_error(__FILE__, __LINE__, ::moe::detail::concat(__VA_ARGS__)); \
  } while (0)

// Unconditional failure with a message.
#define MOE_FAIL(...) ::moe::detail::throw_error(__FILE__, __LINE__, ::moe::detail::concat(__VA_ARGS__))

// MOE_CHECK and MOE_FAIL for a condition every rank evaluates alike (see AgreedError).
#define MOE_CHECK_AGREED(cond, ...)                                                                         \
  do {                                                                                                      \
    if (!(cond)) ::moe::detail::throw_agreed_error(__FILE__, __LINE__, ::moe::detail::concat(__VA_ARGS__)); \
  } while (0)
#define MOE_FAIL_AGREED(...) ::moe::detail::throw_agreed_error(__FILE__, __LINE__, ::moe::detail::concat(__VA_ARGS__))

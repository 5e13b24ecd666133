// Process-wide state a test changes for one scope and puts back: an environment variable (the
// MOE_TEST_* hooks), and the file-size limit that makes writes fail as a full disk would.
#pragma once

#include <sys/resource.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>

#include "error_of.h"

namespace moe::testing {

// Sets an environment variable for one scope (unset after it).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// error_of(f) with this process's files limited to `limit` bytes (RLIMIT_FSIZE) and SIGXFSZ
// ignored, so a write past it fails with EFBIG ("File too large") as a full disk fails with ENOSPC;
// the limit and the signal's action are restored before returning.
inline std::string error_under_file_size_limit(uintmax_t limit, const std::function<void()>& f) {
  rlimit old{};
  if (::getrlimit(RLIMIT_FSIZE, &old) != 0) return "getrlimit failed";
  rlimit small = old;
  small.rlim_cur = limit;
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  if (::setrlimit(RLIMIT_FSIZE, &small) != 0) {
    std::signal(SIGXFSZ, previous);
    return "setrlimit failed";
  }
  const std::string msg = error_of(f);
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  return msg;
}

}  // namespace moe::testing

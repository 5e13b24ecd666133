// Writing a message to stderr from a signal handler: only write(2) is async-signal-safe (no
// stdio, no allocation), and it may write less than asked.
#pragma once

#include <unistd.h>

#include <cstring>

namespace moe {

// Writes the NUL-terminated `text` to stderr, retrying short writes; gives up on an error.
inline void write_stderr_signal_safe(const char* text) {
  size_t n = std::strlen(text);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, text, n);
    if (w <= 0) return;
    text += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace moe

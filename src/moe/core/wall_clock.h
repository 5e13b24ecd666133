// Wall-clock helpers shared by the trainer (step and checkpoint timings, the time of a metrics
// record) and the checkpoint files (timestamped set-aside folder names).
#pragma once

#include <chrono>
#include <ctime>
#include <string>

namespace moe {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// The current UTC time in strftime's `format` (e.g. "%Y-%m-%dT%H:%M:%SZ").
inline std::string utc_time(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

}  // namespace moe

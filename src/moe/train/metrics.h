// Per-step metrics: one JSON object per logged step appended to <run>/metrics.jsonl, and a
// human-readable progress line on stdout.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace moe {

class MetricsLog {
 public:
  // Opens (appends to) path; throws naming the path when it cannot be written.
  explicit MetricsLog(const std::string& path);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  // Writes one line and flushes, so a killed run keeps every completed step.
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);
// "12.3K", "1.20M".
std::string format_count(double value);

}  // namespace moe

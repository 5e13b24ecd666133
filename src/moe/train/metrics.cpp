#include "moe/train/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "moe/ckpt/durable_file.h"
#include "moe/core/bounded_json.h"
#include "moe/core/error.h"

namespace moe {

namespace {

nlohmann::json number(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}

// The step of one metrics line, or -1 when it does not parse as a record.
int64_t record_step(const std::string& line) {
  try {
    const nlohmann::json j = parse_bounded_json(line, "a metrics.jsonl line");
    return j.at("step").get<int64_t>();
  } catch (const nlohmann::json::exception&) {
    return -1;
  } catch (const Error&) {  // nested past the bound: not a record either
    return -1;
  }
}

}  // namespace

nlohmann::json step_record_json(const StepRecord& r, const RunTotals& t, std::optional<double> eval_loss,
                                const std::vector<std::pair<std::string, double>>& eval_sets) {
  nlohmann::json per_layer = nlohmann::json::array();
  for (double v : r.expert_load_per_layer) per_layer.push_back(number(v));
  nlohmann::json j = {{"step", r.step},
                      {"loss", number(r.loss)},
                      {"lm_loss", number(r.lm_loss)},
                      {"lb_loss", number(r.lb_loss)},
                      {"z_loss", number(r.z_loss)},
                      {"grad_norm", number(r.grad_norm)},
                      {"lr", r.lr},
                      {"tokens_per_s", r.tokens_per_s},
                      {"mfu", r.mfu},
                      {"step_time_s", r.step_time_s},
                      {"ideal_time_s", t.ideal_time_s},
                      {"comm_time_s", r.comm_time_s},
                      {"optimizer_time_s", r.optimizer_time_s},
                      {"world_size", t.world_size},
                      {"dropped_fraction", r.dropped_fraction},
                      {"receive_buffer_utilization", r.receive_utilization},
                      {"dispatch_combine_bytes", r.dispatch_bytes},
                      {"expert_load_max_over_mean", number(r.expert_load_max_over_mean)},
                      {"expert_load_max_over_mean_per_layer", per_layer},
                      {"skipped", r.skipped},
                      {"skipped_steps", t.skipped_steps},
                      {"tokens_seen", t.tokens_seen},
                      {"arena_bytes", t.arena_bytes},
                      {"peak_rss_bytes", t.peak_rss_bytes},
                      {"state_bytes", t.state_bytes},
                      {"activation_bytes", t.activation_bytes},
                      {"expert_heap_bytes", t.expert_heap_bytes}};
  if (t.device_high_water_bytes > 0) j["device_high_water_bytes"] = t.device_high_water_bytes;
  if (r.pipeline_bubble_theory > 0) {  // parallel.pp > 1
    j["pipeline_bubble"] = r.pipeline_bubble;
    j["pipeline_bubble_theory"] = r.pipeline_bubble_theory;
  }
  if (eval_loss) j["eval_loss"] = number(*eval_loss);
  if (!eval_sets.empty()) {
    nlohmann::json sets = nlohmann::json::object();
    for (const auto& [name, loss] : eval_sets) sets[name] = number(loss);
    j["eval_sets"] = sets;
  }
  return j;
}

MetricsLog::MetricsLog(std::string path) : path_(std::move(path)) {}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::open() {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  MOE_CHECK(fd_ >= 0, "cannot open metrics file '", path_, "': ", errno_text());
  struct stat st {};
  MOE_CHECK(::fstat(fd_, &st) == 0, "cannot stat metrics file '", path_, "': ", errno_text());
  if (st.st_size == 0) return;
  // A last line without its newline was cut off (a crash or a full disk in an older version):
  // keep those bytes aside and continue after the last whole line.
  const std::string text = read_whole_file(path_, "metrics file");
  if (text.back() == '\n') return;
  const size_t keep = text.find_last_of('\n') == std::string::npos ? 0 : text.find_last_of('\n') + 1;
  std::ofstream partial(path_ + ".partial", std::ios::binary | std::ios::app);
  partial << text.substr(keep) << "\n";
  partial.close();
  MOE_CHECK(partial.good(), "cannot keep the cut-off last line of '", path_, "' in ", path_, ".partial");
  MOE_CHECK(::ftruncate(fd_, static_cast<off_t>(keep)) == 0, "cannot cut the broken last line off '", path_,
            "': ", errno_text());
  std::fprintf(stderr, "warning: %s ended in a cut-off line; moved it to %s.partial\n", path_.c_str(), path_.c_str());
}

void MetricsLog::write(const nlohmann::json& record) {
  if (fd_ < 0) open();
  const std::string line = record.dump() + "\n";
  append_whole(fd_, line, "metrics file", path_);  // never half a line: a reader would fail on it
}

bool metrics_after(const std::string& path, int64_t step) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return false;
  std::istringstream in(read_whole_file(path, "metrics file"));
  std::string line;
  while (std::getline(in, line))
    if (record_step(line) > step) return true;
  return false;
}

int64_t move_metrics_after(const std::string& path, int64_t step, const std::string& dest_dir) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return 0;
  std::istringstream in(read_whole_file(path, "metrics file"));
  std::string line, kept, moved;
  int64_t n = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (record_step(line) > step) {
      moved += line + "\n";
      ++n;
    } else {
      kept += line + "\n";
    }
  }
  if (n == 0) return 0;
  // The copy first, then the shortened file: a crash in between leaves the records in both
  // places (the move runs again and rewrites the same copy), never in neither.
  write_file_atomic(dest_dir + "/metrics.jsonl", moved);
  rewrite_file_atomic(path, kept);  // through a link, the file it names; the link stays
  return n;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof(buf), "%lds", s);
  return buf;
}

std::string format_step_time(double seconds) {
  char buf[32];
  if (seconds >= 0.01)
    std::snprintf(buf, sizeof(buf), "%.4f s", seconds);
  else if (seconds >= 1e-5)
    std::snprintf(buf, sizeof(buf), "%.3f ms", seconds * 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.1f us", seconds * 1e6);
  return buf;
}

std::string format_count(double v) {
  char buf[32];
  if (v >= 1e9)
    std::snprintf(buf, sizeof(buf), "%.2fG", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.2fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof(buf), "%.1fK", v / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  return buf;
}

}  // namespace moe

// Per-step metrics: the record of one optimizer step, its JSON form, and the append-only
// <run>/metrics.jsonl it goes to (one JSON object per logged step).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace moe {

struct StepRecord {
  int64_t step = 0;  // optimizer steps completed
  double loss = 0, lm_loss = 0, lb_loss = 0, z_loss = 0;
  double grad_norm = 0, lr = 0;
  double step_time_s = 0, tokens_per_s = 0, mfu = 0;
  double comm_time_s = 0, optimizer_time_s = 0;  // inside the step: in collectives, in the optimizer step
  double reduction_wait_time_s = 0;  // CPU: of the optimizer step, reducing gradients after the backward
  double dropped_fraction = 0, expert_load_max_over_mean = 0;  // the latter: worst MoE layer
  std::vector<double> expert_load_per_layer;  // max/mean routes per expert, each MoE layer
  double receive_utilization = 0;  // expert-buffer rows filled / rows available
  double dispatch_bytes = 0;       // payload bytes moved by dispatch and combine, all ranks
  // parallel.pp > 1: the measured bubble (idle share of the pipeline phase, mean over ranks) and the
  // schedule's theoretical one; 0 without pipeline.
  double pipeline_bubble = 0, pipeline_bubble_theory = 0;
  bool skipped = false;
  std::string stop_reason;  // not empty: every rank stops after this step (a signal, train.max_duration)
};

// What a metrics record carries besides the step's own numbers.
struct RunTotals {
  double ideal_time_s = 0;   // the step at the MFU denominator's rate
  int world_size = 1;
  int64_t skipped_steps = 0;  // so far, in the whole run (resumes included)
  double tokens_seen = 0;
  size_t arena_bytes = 0, peak_rss_bytes = 0;
  // This rank's plan (memory_plan.h): the state arena (parameters, gradients, optimizer, step
  // buffers), the activation arena, the dispatcher's heap; GPU runs: the device high-water so far.
  size_t state_bytes = 0, activation_bytes = 0, expert_heap_bytes = 0, device_high_water_bytes = 0;
};

// The metrics.jsonl object of one logged step. A non-finite number (a diverged loss, an eval
// on NaN weights) is written as the string "nan", "inf" or "-inf": JSON has no such numbers, and
// dropping the key would hide the fact.
// eval_sets: (name, loss) of the named validation sets, written as "eval_sets": {name: loss}.
nlohmann::json step_record_json(const StepRecord& r, const RunTotals& totals, std::optional<double> eval_loss,
                                const std::vector<std::pair<std::string, double>>& eval_sets = {});

// Appends one line per record. The file is created at the first write (a run that fails before
// its first logged step leaves none). A line is written whole or not at all: a failed or short
// write (a full disk) is cut back off before the error is raised, and a cut-off last line left
// by a crash is moved into <path>.partial when the file is reopened, so every line parses.
class MetricsLog {
 public:
  explicit MetricsLog(std::string path);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void write(const nlohmann::json& record);  // throws naming the path when the line cannot be written

 private:
  void open();
  std::string path_;
  int fd_ = -1;
};

// Moves the records of steps after `step` from the metrics file at `path` into dest/metrics.jsonl
// (the set-aside of an abandoned line; see ckpt/run_checkpoints.h); the kept records are
// rewritten atomically. Idempotent. Returns the number of records moved.
int64_t move_metrics_after(const std::string& path, int64_t step, const std::string& dest_dir);
// Whether the metrics file at `path` has a record of a step after `step` (false when absent).
bool metrics_after(const std::string& path, int64_t step);

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);
// "12.3K", "1.20M".
std::string format_count(double value);
// A step time: "0.1306 s" from 10 ms up, "1.234 ms" below, "12.3 us" below 10 us (a tiny model's
// predicted step is not "0.0000 s").
std::string format_step_time(double seconds);

}  // namespace moe

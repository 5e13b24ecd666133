#include "moe/perf/prediction_report.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "moe/ckpt/durable_file.h"
#include "moe/core/error.h"

namespace moe {

std::string prediction_json(const std::vector<TopologyCandidate>& candidates, const HardwareProfile& hw) {
  nlohmann::ordered_json j;
  j["hardware"] = hw.name;
  j["hardware_measured"] = hw.measured;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const TopologyCandidate& c : candidates) {
    nlohmann::ordered_json r;
    r["layout"] = c.describe();
    r["gpus"] = c.topo.gpus;
    r["nodes"] = c.topo.nodes;
    r["parallel_mode"] = c.topo.layout.mode;
    r["ep"] = c.topo.layout.ep;
    nlohmann::ordered_json changes = nlohmann::ordered_json::object();
    for (const auto& [key, value] : c.changes) changes[key] = value;
    r["changes"] = changes;
    r["feasible"] = c.feasible;
    if (!c.feasible) r["why_not"] = c.why_not;
    r["plan_bytes"] = c.memory.total();
    r["gpu_memory_gib"] = c.memory_gib;
    if (c.prediction.step_s > 0) {
      r["step_s"] = c.prediction.step_s;
      r["tokens_per_s_per_gpu"] = c.prediction.tokens_per_s_per_gpu;
      r["mfu"] = c.prediction.mfu;
      nlohmann::ordered_json parts = nlohmann::ordered_json::array();
      for (const PredictedPart& p : c.prediction.parts)
        parts.push_back({{"part", p.name}, {"ms", 1e3 * p.seconds}, {"work", p.work}, {"unit", p.unit},
                         {"efficiency", p.efficiency}});
      r["parts"] = parts;
    }
    rows.push_back(r);
  }
  j["candidates"] = rows;
  return j.dump(2) + "\n";
}

void write_prediction_json(const std::string& path, const std::vector<TopologyCandidate>& candidates,
                           const HardwareProfile& hw) {
  MOE_CHECK(!std::filesystem::exists(std::filesystem::symlink_status(path)), "plan --json ", path,
            " exists; choose a new file name (nothing is overwritten)");
  write_new_file_atomic(path, prediction_json(candidates, hw), "plan --json");
}

}  // namespace moe

// `moetrain plan --search`: every way to run a config on N GPUs that the trainer supports (DDP
// with each EP degree that divides the GPUs of a node and the experts, and the FSDP baseline),
// each planned for memory with the run's own planning code (train/memory_plan.h) and, where it
// fits, predicted for time (step_model.h); ranked by predicted tokens/s per GPU. A layout that does
// not fit as configured is tried with each memory lever of fit_options (BF16 moments, recompute,
// a smaller microbatch) and kept with the fastest lever that fits.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moe/core/device.h"
#include "moe/perf/step_model.h"
#include "moe/train/memory_plan.h"

namespace moe {

struct TopologyCandidate {
  Topology topo;
  std::vector<std::pair<std::string, std::string>> changes;  // config levers applied so that it fits (key, TOML value)
  Config cfg;                // the config with the layout and the levers applied
  bool feasible = false;
  std::string why_not;       // what makes it infeasible (feasible == false)
  bool out_of_memory = false;  // infeasible for its memory alone (no lever fits), not for a rule of the config
  MemoryRoles memory;        // the largest rank's plan (feasible or planned but too large)
  double memory_gib = 0;     // plan + the profile's runtime reserve: the predicted GPU high-water
  StepPrediction prediction;  // feasible only
  std::string describe() const;  // "ddp ep 8", "fsdp", with the levers
};

// A config with parallel.mode, parallel.ep and the given (key, TOML value) changes applied.
// The keys are the levers fit_options uses: optim.moment_dtype, train.recompute,
// train.micro_batch_size, parallel.ep.
Config with_changes(Config cfg, const std::vector<std::pair<std::string, std::string>>& changes);

// Feasible candidates first, fastest first; then the infeasible ones with their reasons.
// device: the device whose buffers are planned (the GPU; the CPU's in a build without CUDA, for tests).
std::vector<TopologyCandidate> search_topologies(const Config& cfg, int64_t gpus, int64_t nodes,
                                                 const HardwareProfile& hw, Device device);

std::string format_search(const std::vector<TopologyCandidate>& ranked, const Config& cfg, int64_t gpus, int64_t nodes,
                          const HardwareProfile& hw);

}  // namespace moe

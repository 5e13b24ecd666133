// The machine-readable form of `moetrain plan`'s prediction (--json): per candidate layout its
// memory, predicted step time by part, tokens/s per GPU and MFU; bench/validate_model.py reads it
// next to `moetrain bench --json` reports.
#pragma once

#include <string>
#include <vector>

#include "moe/perf/hardware_profile.h"
#include "moe/perf/topology_search.h"

namespace moe {

std::string prediction_json(const std::vector<TopologyCandidate>& candidates, const HardwareProfile& hw);
// Written under a temp name, then renamed; refuses an existing file.
void write_prediction_json(const std::string& path, const std::vector<TopologyCandidate>& candidates,
                           const HardwareProfile& hw);

}  // namespace moe

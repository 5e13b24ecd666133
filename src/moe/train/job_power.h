// Each rank's power window (core/gpu_power.h) brought together for `moetrain bench`: every rank
// watches its own GPU over the timed steps, and the job's line sums the distinct GPUs
// (core/power_summary.h: combine_power).
#pragma once

#include <optional>
#include <string>

#include "moe/comm/communicator.h"
#include "moe/core/power_summary.h"

namespace moe {

// Collective over `world` (host buffers): every rank's window, or why it has none, combined on
// every rank. `mine`: this rank's window (absent when its monitor did not run; `why` says why).
JobPower gather_job_power(Communicator& world, const std::optional<PowerSummary>& mine, const std::string& why);

// The record one rank sends, and back (exposed for tests): JSON, every field of PowerSummary.
std::string power_record(const std::optional<PowerSummary>& mine, const std::string& why);
RankPower parse_power_record(const std::string& record);

}  // namespace moe

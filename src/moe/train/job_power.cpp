#include "moe/train/job_power.h"

#include <nlohmann/json.hpp>

#include <vector>

#include "moe/comm/host_strings.h"
#include "moe/core/error.h"

namespace moe {

namespace {

// The texts (dlerror's, NVML's) may hold bytes that are not UTF-8: replaced, never a throw on one
// rank before the others' collective.
std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

}  // namespace

std::string power_record(const std::optional<PowerSummary>& mine, const std::string& why) {
  if (!mine) return dump(nlohmann::json{{"why", why}});
  const PowerSummary& p = *mine;
  return dump(nlohmann::json{{"host", p.host},
                        {"gpu", p.gpu},
                        {"energy_measured", p.energy_measured},
                        {"seconds", p.seconds},
                        {"energy_j", p.energy_j},
                        {"energy_updates", p.energy_updates},
                        {"limit_w", p.limit_w},
                        {"max_sm_clock_mhz", p.max_sm_clock_mhz},
                        {"mean_sm_clock_mhz", p.mean_sm_clock_mhz},
                        {"samples", p.samples},
                        {"power_capped", p.power_capped},
                        {"thermal", p.thermal},
                        {"hardware_slowdown", p.hardware_slowdown},
                        {"note", p.note}});
}

RankPower parse_power_record(const std::string& record) {
  RankPower r;
  try {
    const nlohmann::json j = nlohmann::json::parse(record);
    if (j.contains("why")) {
      r.why = j.at("why").get<std::string>();
      return r;
    }
    PowerSummary& p = r.summary;
    p.host = j.at("host").get<std::string>();
    p.gpu = j.at("gpu").get<std::string>();
    p.energy_measured = j.at("energy_measured").get<bool>();
    p.seconds = j.at("seconds").get<double>();
    p.energy_j = j.at("energy_j").get<double>();
    p.energy_updates = j.at("energy_updates").get<int64_t>();
    p.limit_w = j.at("limit_w").get<double>();
    p.max_sm_clock_mhz = j.at("max_sm_clock_mhz").get<double>();
    p.mean_sm_clock_mhz = j.at("mean_sm_clock_mhz").get<double>();
    p.samples = j.at("samples").get<int64_t>();
    p.power_capped = j.at("power_capped").get<int64_t>();
    p.thermal = j.at("thermal").get<int64_t>();
    p.hardware_slowdown = j.at("hardware_slowdown").get<int64_t>();
    p.note = j.at("note").get<std::string>();
    r.measured = true;
  } catch (const nlohmann::json::exception& e) {
    MOE_FAIL("a rank's power record could not be read (", e.what(), "): ", record);
  }
  return r;
}

JobPower gather_job_power(Communicator& world, const std::optional<PowerSummary>& mine, const std::string& why) {
  std::vector<RankPower> per_rank;
  for (const std::string& record : all_gather_strings(world, power_record(mine, why)))
    per_rank.push_back(parse_power_record(record));
  return combine_power(per_rank);
}

}  // namespace moe

#include "moe/core/power_summary.h"

#include <algorithm>
#include <cstdio>

namespace moe {

void ClockTally::add(const ClockSample& s) {
  ++samples;
  clock_sum_mhz += s.sm_clock_mhz;
  power_capped += (s.reasons & kClockReasonPowerCap) != 0 ? 1 : 0;
  thermal += (s.reasons & kClockReasonThermal) != 0 ? 1 : 0;
  hardware_slowdown += (s.reasons & kClockReasonHardwareSlowdown) != 0 ? 1 : 0;
}

EnergyWindow energy_window(const std::vector<EnergyReading>& readings) {
  EnergyWindow w;
  if (readings.empty()) return w;
  w.updates = static_cast<int64_t>(readings.size()) - 1;  // the first reading is the start's
  if (w.updates < 2) return w;  // one update: its time is known, the window's other end is not
  w.measured = true;
  w.seconds = readings.back().time_s - readings[1].time_s;
  w.energy_j = readings.back().energy_j - readings[1].energy_j;
  return w;
}

PowerSummary summarize_power(const ClockTally& clocks, const EnergyWindow& energy, double limit_w,
                             double max_sm_clock_mhz) {
  PowerSummary s;
  s.energy_measured = energy.measured;
  s.seconds = energy.measured ? energy.seconds : 0;
  s.energy_j = energy.measured ? energy.energy_j : 0;
  s.energy_updates = energy.updates;
  s.limit_w = limit_w;
  s.max_sm_clock_mhz = max_sm_clock_mhz;
  s.samples = clocks.samples;
  s.power_capped = clocks.power_capped;
  s.thermal = clocks.thermal;
  s.hardware_slowdown = clocks.hardware_slowdown;
  s.mean_sm_clock_mhz = clocks.samples > 0 ? clocks.clock_sum_mhz / static_cast<double>(clocks.samples) : 0;
  return s;
}

std::string format_power(const PowerSummary& s, double step_s, double tokens_per_step, const std::string& gpu) {
  char energy[256];
  if (s.energy_measured) {
    const double per_step = s.energy_per_step_j(step_s);
    std::snprintf(energy, sizeof energy, "%.1f J per step (%.0f tokens/J), %.0f W mean against a %.0f W limit",
                  per_step, per_step > 0 ? tokens_per_step / per_step : 0.0, s.mean_power_w(), s.limit_w);
  } else {
    std::snprintf(energy, sizeof energy,
                  "energy not measured (the counter advanced %ld times in the window; run more steps), a %.0f W "
                  "limit",
                  static_cast<long>(s.energy_updates), s.limit_w);
  }
  char line[640];
  std::snprintf(line, sizeof line,
                "  power (%s, NVML): %s; SM clock %.0f MHz mean of %.0f; held back by the power cap in %ld of %ld "
                "samples, thermal %ld, hardware slowdown %ld%s%s\n",
                gpu.c_str(), energy, s.mean_sm_clock_mhz, s.max_sm_clock_mhz, static_cast<long>(s.power_capped),
                static_cast<long>(s.samples), static_cast<long>(s.thermal), static_cast<long>(s.hardware_slowdown),
                s.note.empty() ? "" : "; ", s.note.c_str());
  return line;
}

JobPower combine_power(const std::vector<RankPower>& per_rank) {
  JobPower job;
  job.ranks = static_cast<int>(per_rank.size());
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const RankPower& p = per_rank[r];
    if (!p.measured) {
      job.unmeasured.push_back("rank " + std::to_string(r) + ": " + p.why);
      continue;
    }
    const bool seen = std::any_of(job.gpus.begin(), job.gpus.end(),
                                  [&](const PowerSummary& g) { return g.host == p.summary.host && g.gpu == p.summary.gpu; });
    if (!seen) job.gpus.push_back(p.summary);
  }
  return job;
}

bool JobPower::energy_measured() const {
  return !gpus.empty() && unmeasured.empty() &&
         std::all_of(gpus.begin(), gpus.end(), [](const PowerSummary& g) { return g.energy_measured; });
}

double JobPower::energy_per_step_j(double step_s) const {
  if (!energy_measured()) return 0;
  double sum = 0;
  for (const PowerSummary& g : gpus) sum += g.energy_per_step_j(step_s);
  return sum;
}

double JobPower::mean_power_per_gpu_w() const {
  if (!energy_measured()) return 0;
  double sum = 0;
  for (const PowerSummary& g : gpus) sum += g.mean_power_w();
  return sum / static_cast<double>(gpus.size());
}

std::string format_job_power(const JobPower& job, double step_s, double tokens_per_step) {
  std::string missing;
  for (const std::string& u : job.unmeasured) missing += (missing.empty() ? "" : "; ") + u;
  if (job.gpus.empty()) return "  power: not recorded (" + missing + ")\n";
  if (job.gpus.size() == 1 && job.unmeasured.empty())
    return format_power(job.gpus[0], step_s, tokens_per_step,
                        job.ranks > 1 ? "the GPU of all " + std::to_string(job.ranks) + " ranks" : "the GPU");
  double limit_lo = job.gpus[0].limit_w, limit_hi = limit_lo, max_clock = 0, clock_sum = 0;
  int64_t samples = 0, capped = 0, thermal = 0, slowdown = 0;
  std::string notes;
  for (const PowerSummary& g : job.gpus) {
    limit_lo = std::min(limit_lo, g.limit_w), limit_hi = std::max(limit_hi, g.limit_w);
    max_clock = std::max(max_clock, g.max_sm_clock_mhz);
    clock_sum += g.mean_sm_clock_mhz * static_cast<double>(g.samples);
    samples += g.samples, capped += g.power_capped, thermal += g.thermal, slowdown += g.hardware_slowdown;
    if (!g.note.empty()) notes += "; GPU " + g.gpu + ": " + g.note;
  }
  char limit[64];
  if (limit_lo == limit_hi) std::snprintf(limit, sizeof limit, "a %.0f W limit each", limit_lo);
  else std::snprintf(limit, sizeof limit, "limits of %.0f-%.0f W", limit_lo, limit_hi);
  char energy[320];
  if (job.energy_measured()) {
    const double per_step = job.energy_per_step_j(step_s);
    std::snprintf(energy, sizeof energy, "%.1f J per step summed (%.0f tokens/J), %.0f W mean per GPU against %s",
                  per_step, per_step > 0 ? tokens_per_step / per_step : 0.0, job.mean_power_per_gpu_w(), limit);
  } else {
    std::snprintf(energy, sizeof energy, "energy not summed (%s), %s",
                  job.unmeasured.empty() ? "a GPU's counter advanced fewer than twice in the window; run more steps"
                                         : "not every rank's GPU was read",
                  limit);
  }
  char line[768];
  std::snprintf(line, sizeof line,
                "  power (%zu GPU%s of %d ranks, NVML): %s; SM clock %.0f MHz mean of %.0f; held back by the power "
                "cap in %ld of %ld samples, thermal %ld, hardware slowdown %ld",
                job.gpus.size(), job.gpus.size() == 1 ? "" : "s", job.ranks, energy, samples > 0 ? clock_sum / static_cast<double>(samples) : 0.0,
                max_clock, static_cast<long>(capped), static_cast<long>(samples), static_cast<long>(thermal),
                static_cast<long>(slowdown));
  return line + notes + (missing.empty() ? "" : "; no window on " + missing) + "\n";
}

}  // namespace moe

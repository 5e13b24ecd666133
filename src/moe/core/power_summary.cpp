#include "moe/core/power_summary.h"

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
    const double per_step = s.mean_power_w() * step_s;
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

}  // namespace moe

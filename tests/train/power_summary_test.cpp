// The arithmetic behind bench's power line (core/power_summary.h): the clock samples' tally, the
// energy between the counter's updates, and the printed line. The NVML sampling itself is
// tested on a GPU (tests/cuda/test_cuda_power.cpp).
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "moe/core/power_summary.h"

namespace moe {
namespace {

ClockTally tally_of(const std::vector<ClockSample>& samples) {
  ClockTally t;
  for (const ClockSample& s : samples) t.add(s);
  return t;
}

TEST(PowerSummary, counts_each_slowdown_reason_and_takes_the_mean_power_from_the_energy) {
  const ClockTally clocks = tally_of({
      {1980, 0},                            // full clock
      {1700, kClockReasonPowerCap},         // the power cap
      {1600, kClockReasonPowerCap | 0x20},  // the power cap and a software thermal slowdown
      {1500, 0x80},                         // the hardware power brake
      {1820, 0x1},                          // idle only: no slowdown counted
  });
  EnergyWindow w;
  w.measured = true, w.seconds = 2.0, w.energy_j = 1300.0, w.updates = 20;
  const PowerSummary s = summarize_power(clocks, w, 700.0, 1980.0);
  EXPECT_EQ(s.samples, 5);
  EXPECT_EQ(s.power_capped, 2);
  EXPECT_EQ(s.thermal, 1);
  EXPECT_EQ(s.hardware_slowdown, 1);
  EXPECT_DOUBLE_EQ(s.mean_sm_clock_mhz, (1980.0 + 1700 + 1600 + 1500 + 1820) / 5);
  EXPECT_DOUBLE_EQ(s.mean_power_w(), 650.0);  // 1300 J over 2 s
  EXPECT_DOUBLE_EQ(s.energy_per_step_j(0.2), 130.0);  // 650 W for 0.2 s
  EXPECT_EQ(s.energy_updates, 20);
  EXPECT_DOUBLE_EQ(s.limit_w, 700.0);
  EXPECT_DOUBLE_EQ(s.max_sm_clock_mhz, 1980.0);

  const PowerSummary none = summarize_power(ClockTally{}, EnergyWindow{}, 700.0, 1980.0);
  EXPECT_EQ(none.samples, 0);
  EXPECT_EQ(none.mean_sm_clock_mhz, 0.0);
  EXPECT_FALSE(none.energy_measured);
  EXPECT_EQ(none.mean_power_w(), 0.0);  // no window: no division by zero
  EXPECT_EQ(none.energy_per_step_j(0.2), 0.0);
}

TEST(EnergyWindow, spans_the_first_and_last_counter_updates) {
  // The counter advances every 100 ms by 70 J (700 W); the start (t = 0.03) and the stop fall
  // between updates, so a start/stop difference would count 4 updates over 0.44 s (636 W).
  const std::vector<EnergyReading> readings = {
      {0.03, 1000}, {0.101, 1070}, {0.201, 1140}, {0.301, 1210}, {0.401, 1280}};
  const EnergyWindow w = energy_window(readings);
  EXPECT_TRUE(w.measured);
  EXPECT_NEAR(w.seconds, 0.3, 1e-12);
  EXPECT_NEAR(w.energy_j, 210.0, 1e-12);
  EXPECT_EQ(w.updates, 4);
  EXPECT_NEAR(w.energy_j / w.seconds, 700.0, 1e-9);

  // Fewer than two updates after the start: the window's ends are not both known, so no reading
  // (a start/stop difference there is off by up to an update's energy).
  for (const std::vector<EnergyReading>& few : std::vector<std::vector<EnergyReading>>{
           {{0.03, 1000}, {0.101, 1070}}, {{0.03, 1000}}, {}}) {
    const EnergyWindow none = energy_window(few);
    EXPECT_FALSE(none.measured);
    EXPECT_EQ(none.seconds, 0.0);
    EXPECT_EQ(none.energy_j, 0.0);
    EXPECT_EQ(none.updates, few.empty() ? 0 : static_cast<int64_t>(few.size()) - 1);
  }
}

TEST(PowerSummary, the_bench_line_gives_energy_per_step_and_per_token_or_says_why_not) {
  EnergyWindow w;
  w.measured = true, w.seconds = 1.5, w.energy_j = 900.0, w.updates = 15;
  const PowerSummary s =
      summarize_power(tally_of({{1787, kClockReasonPowerCap}, {1790, kClockReasonPowerCap}}), w, 700.0, 1980.0);
  // 600 W (900 J over 1.5 s) for 0.16 s steps of 32768 tokens: 96 J per step, 341 tokens/J.
  const std::string line = format_power(s, 0.16, 32768, "the GPU");
  std::cout << line;
  EXPECT_NE(line.find("power (the GPU, NVML): 96.0 J per step (341 tokens/J)"), std::string::npos) << line;
  EXPECT_NE(line.find("600 W mean against a 700 W limit"), std::string::npos) << line;
  EXPECT_NE(line.find("SM clock 1788 MHz mean of 1980"), std::string::npos) << line;
  EXPECT_NE(line.find("power cap in 2 of 2 samples, thermal 0, hardware slowdown 0\n"), std::string::npos) << line;

  PowerSummary short_window = summarize_power(tally_of({{1980, 0}}), EnergyWindow{false, 0, 0, 1}, 700.0, 1980.0);
  short_window.note = "nvmlDeviceGetClockInfo failed: Unknown Error";
  const std::string none = format_power(short_window, 0.16, 32768, "rank 0's GPU");
  std::cout << none;
  EXPECT_NE(none.find("energy not measured (the counter advanced 1 times in the window; run more steps)"),
            std::string::npos)
      << none;
  EXPECT_EQ(none.find("J per step"), std::string::npos) << none;
  EXPECT_NE(none.find("; nvmlDeviceGetClockInfo failed: Unknown Error\n"), std::string::npos) << none;
}

}  // namespace
}  // namespace moe

// PowerMonitor (NVML) and its bench line. The summary and format tests and the "not available"
// test run everywhere this folder builds; the reading test needs a GPU and NVML and skips with the
// reason otherwise. On the GPU: a window of ~0.4 s of large matmuls must report the energy and
// clock NVML sees, consistent with each other and with the board's limits (the printed line also
// shows how often the energy counter advanced there).
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/error.h"
#include "moe/core/gpu_power.h"
#include "moe/ops/gemm.h"

namespace moe {
namespace {

TEST(PowerSummary, counts_each_slowdown_reason_and_takes_the_mean_power_from_the_energy) {
  const std::vector<ClockSample> samples = {
      {1980, 0},                            // full clock
      {1700, kClockReasonPowerCap},         // the power cap
      {1600, kClockReasonPowerCap | 0x20},  // the power cap and a software thermal slowdown
      {1500, 0x80},                         // the hardware power brake
      {1820, 0x1},                          // idle only: no slowdown counted
  };
  const PowerSummary s = summarize_power(samples, EnergyWindow{2.0, 1300.0, 20}, 700.0, 1980.0);
  EXPECT_EQ(s.samples, 5);
  EXPECT_EQ(s.power_capped, 2);
  EXPECT_EQ(s.thermal, 1);
  EXPECT_EQ(s.hardware_slowdown, 1);
  EXPECT_DOUBLE_EQ(s.mean_sm_clock_mhz, (1980.0 + 1700 + 1600 + 1500 + 1820) / 5);
  EXPECT_DOUBLE_EQ(s.mean_power_w(), 650.0);  // 1300 J over 2 s
  EXPECT_EQ(s.energy_updates, 20);
  EXPECT_DOUBLE_EQ(s.limit_w, 700.0);
  EXPECT_DOUBLE_EQ(s.max_sm_clock_mhz, 1980.0);

  const PowerSummary none = summarize_power({}, EnergyWindow{}, 700.0, 1980.0);
  EXPECT_EQ(none.samples, 0);
  EXPECT_EQ(none.mean_sm_clock_mhz, 0.0);
  EXPECT_EQ(none.mean_power_w(), 0.0);  // no window: no division by zero
}

TEST(EnergyWindow, spans_the_first_and_last_counter_updates) {
  // The counter advances every 100 ms by 70 J (700 W); the start (t = 0.03) and the stop (t = 0.47)
  // fall between updates, so their difference would count 4 updates over 0.44 s (636 W).
  const std::vector<EnergyReading> readings = {{0.03, 1000}, {0.101, 1070}, {0.201, 1140}, {0.301, 1210}, {0.401, 1280}};
  const EnergyWindow w = energy_window(readings, {0.47, 1280});
  EXPECT_NEAR(w.seconds, 0.3, 1e-12);
  EXPECT_NEAR(w.energy_j, 210.0, 1e-12);
  EXPECT_EQ(w.updates, 3);
  EXPECT_NEAR(w.energy_j / w.seconds, 700.0, 1e-9);

  // One update or none: the whole span from the start to the stop.
  const EnergyWindow one = energy_window({{0.03, 1000}, {0.101, 1070}}, {0.15, 1070});
  EXPECT_NEAR(one.seconds, 0.12, 1e-12);
  EXPECT_NEAR(one.energy_j, 70.0, 1e-12);
  EXPECT_EQ(one.updates, 1);
  const EnergyWindow none = energy_window({{0.03, 1000}}, {0.05, 1000});
  EXPECT_NEAR(none.seconds, 0.02, 1e-12);
  EXPECT_EQ(none.energy_j, 0.0);
  EXPECT_EQ(none.updates, 0);
  EXPECT_EQ(energy_window({}, {1.0, 5.0}).seconds, 0.0);  // never started
}

TEST(PowerSummary, the_bench_line_gives_energy_per_step_and_per_token) {
  const PowerSummary s = summarize_power({{1787, kClockReasonPowerCap}, {1790, kClockReasonPowerCap}},
                                         EnergyWindow{1.5, 900.0, 15}, 700.0, 1980.0);
  // 600 W (900 J over 1.5 s) for 0.16 s steps of 32768 tokens: 96 J per step, 341 tokens/J.
  const std::string line = format_power(s, 0.16, 32768, "the GPU");
  std::cout << line;
  EXPECT_NE(line.find("power (the GPU, NVML): 96.0 J per step (341 tokens/J)"), std::string::npos) << line;
  EXPECT_NE(line.find("600 W mean against a 700 W limit"), std::string::npos) << line;
  EXPECT_NE(line.find("SM clock 1788 MHz mean of 1980"), std::string::npos) << line;
  EXPECT_NE(line.find("power cap in 2 of 2 samples, thermal 0, hardware slowdown 0"), std::string::npos) << line;
}

TEST(PowerMonitor, unavailable_monitor_says_why_and_refuses_to_start) {
  PowerMonitor monitor;
  if (monitor.available()) GTEST_SKIP() << "NVML and a GPU are here; the reading test covers this build";
  EXPECT_FALSE(monitor.why().empty());
  EXPECT_THROW(monitor.start(), Error);
  EXPECT_FALSE(monitor.running());
  monitor.stop();  // not running: nothing to do
  EXPECT_EQ(monitor.summary().samples, 0);
}

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;

TEST(PowerMonitorGpu, a_busy_window_reports_energy_clock_and_limit_consistently) {
  MOE_SKIP_WITHOUT_GPU();
  PowerMonitor monitor(0.005);
  if (!monitor.available()) GTEST_SKIP() << monitor.why();
  constexpr int64_t n = 4096;
  DeviceBuffer a{DType::BF16, {n, n}}, b{DType::BF16, {n, n}}, c{DType::BF16, {n, n}};
  a.upload(std::vector<float>(n * n, 0.01f));
  b.upload(std::vector<float>(n * n, 0.01f));
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  monitor.start();
  EXPECT_TRUE(monitor.running());
  EXPECT_THROW(monitor.start(), Error);  // one window at a time
  // ~0.4 s of work on any current GPU: 137 GFLOP per product, 2000 of them.
  for (int i = 0; i < 2000; ++i) matmul(c, a, b, false, false, 1.0f, 0.0f);
  CUDA_CHECK(cudaDeviceSynchronize());
  monitor.stop();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(monitor.running());
  const PowerSummary s = monitor.summary();
  std::cout << format_power(s, s.seconds, 1, "the GPU") << "window " << wall << " s, energy window " << s.seconds
            << " s over " << s.energy_updates << " counter updates\n";
  EXPECT_GT(s.seconds, 0.0);
  EXPECT_LE(s.seconds, wall + 1e-3);
  EXPECT_GE(s.energy_updates, 2);                               // the counter advanced during the work
  EXPECT_GE(s.samples, static_cast<int64_t>(0.3 * wall / 0.005));  // polled about every 5 ms
  EXPECT_GT(s.limit_w, 50.0);
  EXPECT_GT(s.max_sm_clock_mhz, 300.0);
  EXPECT_GT(s.mean_sm_clock_mhz, 0.0);
  EXPECT_LE(s.mean_sm_clock_mhz, s.max_sm_clock_mhz);
  // A busy GPU draws more than idle (~10% of its limit) and, averaged over the window, at most
  // a little above the enforced limit (the limit holds for NVML's averaged reading).
  EXPECT_GT(s.mean_power_w(), 0.1 * s.limit_w);
  EXPECT_LT(s.mean_power_w(), 1.25 * s.limit_w);
  EXPECT_LE(s.power_capped, s.samples);
}
#endif

}  // namespace
}  // namespace moe

// PowerMonitor (NVML). The "not available" test runs everywhere this folder builds; the reading
// test needs a GPU and NVML and skips with the reason otherwise. On the GPU: a window of ~0.4 s of
// large matmuls must report the energy and clock NVML sees, consistent with each other and with
// the board's limits (the printed line also shows how often the energy counter advanced there).
// The summary arithmetic is tested on the CPU (tests/train/power_summary_test.cpp).
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

TEST(PowerMonitor, unavailable_monitor_says_why_and_refuses_to_start) {
  PowerMonitor monitor;
  if (monitor.available()) GTEST_SKIP() << "NVML and a GPU are here; the reading test covers this build";
  EXPECT_FALSE(monitor.why().empty());
  EXPECT_FALSE(monitor.start());  // no window, no throw: a bench goes on without its power line
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
  ASSERT_TRUE(monitor.start()) << monitor.why();
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
  EXPECT_TRUE(s.energy_measured);  // the counter advanced at least twice during the work
  EXPECT_TRUE(s.note.empty()) << s.note;
  // The GPU's PCI bus id (domain:bus:device.function, as 0000:19:00.0): with the host, what tells
  // ranks sharing a GPU from ranks on their own.
  EXPECT_NE(s.gpu.find(':'), std::string::npos) << s.gpu;
  EXPECT_NE(s.gpu.find('.'), std::string::npos) << s.gpu;
  EXPECT_FALSE(s.host.empty());
  EXPECT_GT(s.seconds, 0.0);
  EXPECT_LE(s.seconds, wall + 1e-3);
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

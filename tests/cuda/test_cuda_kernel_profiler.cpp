// KernelProfiler (CUPTI) and its table. The table tests and the "not available" test run
// everywhere; the recording tests need a GPU and CUPTI and skip with the reason otherwise.
// On the GPU: a known number of launches of a distinctively named kernel (swiglu_forward_kernel),
// of device-to-device copies and of cuBLASLt matmuls must come back as exactly that many calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/error.h"
#include "moe/core/kernel_profiler.h"
#include "moe/ops/activation.h"
#include "moe/ops/gemm.h"

namespace moe {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) lines.push_back(line);
  return lines;
}

// The whitespace-separated fields of a table row: rank, share, total, ms/step, ms/call, calls, name.
std::vector<std::string> fields_of(const std::string& row) {
  std::vector<std::string> fields;
  std::istringstream is(row);
  for (std::string field; is >> field;) fields.push_back(field);
  return fields;
}

TEST(KernelTable, rows_keep_the_given_order_with_shares_of_the_total_and_per_step_times) {
  // total 10 ms over 2 steps; the listed entries cover 9.5 ms of it.
  const std::vector<KernelProfiler::Entry> entries = {
      {"_ZN3moe4cuda12_GLOBAL__N_121swiglu_forward_kernelIfEEvPT_PKS3_ll", 10, 6.0},
      {"[memcpy DtoD]", 4, 3.0},
      {"sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", 2, 0.5},
  };
  const std::vector<std::string> lines = lines_of(format_kernel_table(entries, 10.0, 2));
  ASSERT_EQ(lines.size(), 2 + entries.size() + 1) << format_kernel_table(entries, 10.0, 2);
  EXPECT_NE(lines[0].find("10.000 ms, 5.000 ms per step"), std::string::npos) << lines[0];

  const std::vector<std::string> first = fields_of(lines[2]);
  ASSERT_EQ(first.size(), 7u) << lines[2];
  EXPECT_EQ(first[0], "1");
  EXPECT_EQ(first[1], "60.0%");
  EXPECT_EQ(first[2], "6.000");
  EXPECT_EQ(first[3], "3.000");
  EXPECT_EQ(first[4], "0.6000");
  EXPECT_EQ(first[5], "10");
  // Demangled, without return type, parameters or "(anonymous namespace)::".
  EXPECT_EQ(first[6], "moe::cuda::swiglu_forward_kernel<float>");

  const std::vector<std::string> second = fields_of(lines[3]);
  ASSERT_EQ(second.size(), 8u) << lines[3];  // "[memcpy DtoD]" is two fields
  EXPECT_EQ(second[0], "2");
  EXPECT_EQ(second[1], "30.0%");
  EXPECT_EQ(second[5], "4");
  EXPECT_NE(lines[3].find("  [memcpy DtoD]"), std::string::npos) << lines[3];

  const std::vector<std::string> third = fields_of(lines[4]);
  ASSERT_EQ(third.size(), 7u) << lines[4];
  EXPECT_EQ(third[0], "3");
  EXPECT_EQ(third[1], "5.0%");
  EXPECT_EQ(third[6], entries[2].name);  // extern "C" names stay as they are

  EXPECT_NE(lines[5].find("9.500 ms, 95.0% of the total"), std::string::npos) << lines[5];
}

TEST(KernelTable, long_names_are_cut_to_100_characters) {
  const std::string name(150, 'k');
  const std::vector<std::string> lines = lines_of(format_kernel_table({{name, 1, 1.0}}, 1.0, 1));
  ASSERT_EQ(lines.size(), 4u);
  const std::vector<std::string> row = fields_of(lines[2]);
  ASSERT_EQ(row.size(), 7u);
  EXPECT_EQ(row[6], std::string(97, 'k') + "...");
}

TEST(KernelTable, no_time_gives_zero_shares_and_zero_steps_are_refused) {
  const std::vector<std::string> lines = lines_of(format_kernel_table({{"[memset]", 3, 0.0}}, 0.0, 1));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(fields_of(lines[2])[1], "0.0%");
  EXPECT_THROW(format_kernel_table({}, 1.0, 0), Error);
}

TEST(KernelProfiler, unavailable_profiler_says_why_and_refuses_to_start) {
  KernelProfiler profiler;
  if (profiler.available()) GTEST_SKIP() << "CUPTI is available here; the recording tests cover this build";
  EXPECT_FALSE(profiler.why().empty());
  EXPECT_THROW(profiler.start(), Error);
  EXPECT_TRUE(profiler.top(10).empty());
  EXPECT_EQ(profiler.total_ms(), 0.0);
}

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;

const KernelProfiler::Entry* find_entry(const std::vector<KernelProfiler::Entry>& entries, const std::string& part) {
  for (const KernelProfiler::Entry& e : entries)
    if (e.name.find(part) != std::string::npos) return &e;
  return nullptr;
}

// Buffers for the ops below, filled before recording starts (their uploads are not counted).
struct Workload {
  DeviceBuffer gate_up{DType::F32, {256, 1024}}, act{DType::F32, {256, 512}};
  DeviceBuffer a{DType::F32, {128, 64}}, b{DType::F32, {64, 96}};
  DeviceBuffer c{DType::F32, {128, 96}}, c_copy{DType::F32, {128, 96}};
  Workload() {
    gate_up.upload(std::vector<float>(256 * 1024, 0.5f));
    a.upload(std::vector<float>(128 * 64, 0.25f));
    b.upload(std::vector<float>(64 * 96, 0.25f));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
};

TEST(KernelProfilerGpu, counts_every_launch_of_a_named_kernel_copy_and_matmul) {
  MOE_SKIP_WITHOUT_GPU();
  KernelProfiler profiler;
  if (!profiler.available()) GTEST_SKIP() << profiler.why();
  Workload w;
  constexpr int kSwiglus = 5, kMatmuls = 3, kCopies = 2;
  profiler.start();
  for (int i = 0; i < kSwiglus; ++i) swiglu_forward(w.act, w.gate_up);
  for (int i = 0; i < kMatmuls; ++i) matmul(w.c, w.a, w.b, false, false, 1.0f, 0.0f);
  for (int i = 0; i < kCopies; ++i) copy_bytes(w.c_copy, w.c);
  profiler.stop();

  const std::vector<KernelProfiler::Entry> entries = profiler.top(1000);
  std::cout << format_kernel_table(profiler.top(10), profiler.total_ms(), 1);
  ASSERT_FALSE(entries.empty());
  EXPECT_GT(profiler.total_ms(), 0.0);
  double sum_ms = 0;
  int64_t other_calls = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_FALSE(entries[i].name.empty());
    EXPECT_GT(entries[i].calls, 0);
    if (i > 0) {
      EXPECT_LE(entries[i].total_ms, entries[i - 1].total_ms);
    }
    sum_ms += entries[i].total_ms;
    if (entries[i].name.find("swiglu_forward_kernel") == std::string::npos && entries[i].name != "[memcpy DtoD]")
      other_calls += entries[i].calls;
  }
  EXPECT_NEAR(sum_ms, profiler.total_ms(), 1e-9 * std::max(1.0, sum_ms));

  const KernelProfiler::Entry* swiglu = find_entry(entries, "swiglu_forward_kernel");
  ASSERT_NE(swiglu, nullptr);
  EXPECT_EQ(swiglu->calls, kSwiglus);
  EXPECT_GT(swiglu->total_ms, 0.0);
  const KernelProfiler::Entry* copy = find_entry(entries, "[memcpy DtoD]");
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->calls, kCopies);
  EXPECT_GE(other_calls, kMatmuls);  // cuBLASLt: at least one kernel per matmul
}

TEST(KernelProfilerGpu, a_new_window_counts_only_its_own_launches_and_one_profiler_records_at_a_time) {
  MOE_SKIP_WITHOUT_GPU();
  KernelProfiler profiler;
  if (!profiler.available()) GTEST_SKIP() << profiler.why();
  Workload w;
  profiler.start();
  for (int i = 0; i < 4; ++i) swiglu_forward(w.act, w.gate_up);
  KernelProfiler second;
  EXPECT_THROW(second.start(), Error);
  profiler.stop();
  swiglu_forward(w.act, w.gate_up);  // between windows: not counted
  CUDA_CHECK(cudaDeviceSynchronize());

  profiler.start();
  for (int i = 0; i < 2; ++i) swiglu_forward(w.act, w.gate_up);
  profiler.stop();
  const KernelProfiler::Entry* swiglu = find_entry(profiler.top(1000), "swiglu_forward_kernel");
  ASSERT_NE(swiglu, nullptr);
  EXPECT_EQ(swiglu->calls, 2);

  // The first profiler is done, so another one may record now.
  second.start();
  swiglu_forward(w.act, w.gate_up);
  second.stop();
  const KernelProfiler::Entry* again = find_entry(second.top(1000), "swiglu_forward_kernel");
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->calls, 1);
}
#endif

}  // namespace
}  // namespace moe

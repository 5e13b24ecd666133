// `moetrain plan --search`: every layout the trainer runs, planned for memory by the run's own
// planning code and ranked by predicted throughput; layouts that cannot run or do not fit are
// refused with the reason. Memory is planned for CPU ranks here (a build without CUDA cannot plan
// the GPU's buffers); the ranking logic does not depend on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "moe/perf/topology_search.h"

namespace moe {
namespace {

HardwareProfile gpu(double memory_gib, int per_node = 8) {
  HardwareProfile p = load_hardware_profile("h200");
  p.memory_gib = memory_gib, p.runtime_reserve_gib = 0, p.gpus_per_node = per_node;
  return p;
}

Config tiny(int64_t global_batch) {
  Config c;  // the built-in defaults: the tiny model, 8 experts
  c.train.micro_batch_size = 2, c.train.global_batch_size = global_batch;
  return c;
}

TEST(TopologySearch, ranks_every_layout_that_fits_by_predicted_tokens_per_gpu) {
  const auto ranked = search_topologies(tiny(8), 4, 1, gpu(64), Device::CPU);
  std::vector<std::string> layouts;
  for (const auto& c : ranked) {
    ASSERT_TRUE(c.feasible) << c.describe() << ": " << c.why_not;
    EXPECT_GT(c.memory.total(), 0u);
    EXPECT_GT(c.prediction.tokens_per_s_per_gpu, 0);
    layouts.push_back(c.describe());
  }
  std::sort(layouts.begin(), layouts.end());
  EXPECT_EQ(layouts, (std::vector<std::string>{"ddp ep 1", "ddp ep 2", "ddp ep 4", "fsdp"}));
  for (size_t i = 1; i < ranked.size(); ++i)
    EXPECT_GE(ranked[i - 1].prediction.tokens_per_s_per_gpu, ranked[i].prediction.tokens_per_s_per_gpu);
  // The memory of each is the plan of that layout: EP 4 holds a quarter of the experts.
  const auto by = [&](const std::string& name) {
    return *std::find_if(ranked.begin(), ranked.end(), [&](const auto& c) { return c.describe() == name; });
  };
  EXPECT_LT(by("ddp ep 4").memory.parameters, by("ddp ep 1").memory.parameters);
  const std::string table = format_search(ranked, tiny(8), 4, 1, gpu(64));
  EXPECT_NE(table.find("ranked by predicted tokens/s per GPU (measured profile)\n"), std::string::npos) << table;
  HardwareProfile datasheet = gpu(64);
  datasheet.measured = false;
  EXPECT_NE(format_search(ranked, tiny(8), 4, 1, datasheet)
                .find("(datasheet profile, efficiencies not measured on this GPU)\n"),
            std::string::npos);
  EXPECT_NE(table.find("1    "), std::string::npos) << table;
}

TEST(TopologySearch, refuses_layouts_that_cannot_run_or_do_not_fit_and_says_why) {
  // EP is bounded by the GPUs of a node: with 2 per node, ep 4 is not offered.
  for (const auto& c : search_topologies(tiny(8), 4, 2, gpu(64, 2), Device::CPU)) EXPECT_NE(c.describe(), "ddp ep 4");
  // A batch the ranks cannot split: every layout refused, naming the key.
  const auto odd = search_topologies(tiny(6), 4, 1, gpu(64), Device::CPU);
  ASSERT_FALSE(odd.empty());
  for (const auto& c : odd) {
    EXPECT_FALSE(c.feasible) << c.describe();
    EXPECT_NE(c.why_not.find("global_batch_size"), std::string::npos) << c.why_not;
  }
  // Refused by a rule of the config, not by memory: no "fits", which would send the user after memory.
  const std::string odd_text = format_search(odd, tiny(6), 4, 1, gpu(64));
  EXPECT_NE(odd_text.find("no layout can run on 4 GPUs (each layout's reason below)\n"), std::string::npos) << odd_text;
  EXPECT_EQ(odd_text.find("fits"), std::string::npos) << odd_text;
  // Too little memory for any lever: refused with the bytes it needs.
  const auto small = search_topologies(tiny(8), 4, 1, gpu(1e-4), Device::CPU);
  for (const auto& c : small) {
    EXPECT_FALSE(c.feasible) << c.describe();
    EXPECT_NE(c.why_not.find("per GPU"), std::string::npos) << c.why_not;
  }
  EXPECT_NE(format_search(small, tiny(8), 4, 1, gpu(1e-4)).find("no layout fits in the memory of 4 GPUs\n"),
            std::string::npos);
}

TEST(TopologySearch, a_layout_that_fits_only_with_a_lever_carries_the_lever) {
  // Between the plan with F32 moments and with BF16 moments: only the BF16-moment variants fit.
  const Config c = tiny(8);
  const MemoryRoles f32 = plan_largest_rank(c, 1, Device::CPU);
  Config bf = c;
  bf.optim.moment_dtype = DType::BF16;
  const MemoryRoles bf16 = plan_largest_rank(bf, 1, Device::CPU);
  ASSERT_LT(bf16.total(), f32.total());
  const double gib = static_cast<double>(size_t{1} << 30);
  const double between = (static_cast<double>(bf16.total()) + static_cast<double>(f32.total())) / 2 / gib;
  const auto ranked = search_topologies(c, 1, 1, gpu(between), Device::CPU);
  const auto it =
      std::find_if(ranked.begin(), ranked.end(), [](const auto& x) { return x.describe().rfind("ddp", 0) == 0; });
  ASSERT_NE(it, ranked.end());
  ASSERT_TRUE(it->feasible) << it->why_not;
  EXPECT_FALSE(it->changes.empty());
  EXPECT_LE(it->memory.total(), static_cast<size_t>(between * gib));
  EXPECT_NE(it->describe().find(" = "), std::string::npos) << it->describe();
}

}  // namespace
}  // namespace moe

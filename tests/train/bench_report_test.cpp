// `moetrain bench --json`: the report carries the run's numbers (computed from the summary and the
// config, per GPU where asked), parses back as JSON, and is written whole or not at all.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moe/core/error.h"
#include "moe/train/bench_report.h"
#include "train_test_util.h"

namespace moe {
namespace {

TrainSummary two_steps() {
  TrainSummary s;
  s.steps.resize(2);
  s.steps[1].loss = 3.25;
  s.mean_tokens_per_s = 80000;
  s.mean_mfu = 0.4;
  s.mean_step_time_s = 0.5;
  s.timed_steps = 1;
  s.device = Device::CUDA;
  s.graph_nodes = 12;
  return s;
}

TEST(BenchReport, carries_the_runs_numbers_per_gpu) {
  testing::TempDir dir;
  Config cfg = testing::small_config(dir.path, {"model.num_experts=16", "parallel.ep=2", "train.deterministic=true"});
  SplitRow row;
  row.group = KernelGroup::ExpertGemm;
  row.ms_per_step = 12.5;
  row.share = 0.25;
  row.rate = 600;
  row.unit = "TFLOP/s";
  row.ceiling = 800;
  Ceilings c;
  c.gemm_tflops = 800;
  c.copy_tb_s = 4.1;
  const auto j = nlohmann::json::parse(bench_report_json(cfg, two_steps(), 4, {row}, c, nullptr));
  EXPECT_EQ(j["world_size"], 4);
  EXPECT_EQ(j["num_experts"], 16);
  EXPECT_EQ(j["ep"], 2);
  EXPECT_EQ(j["parallel_mode"], "ddp");
  EXPECT_EQ(j["pp"], 1);
  EXPECT_EQ(j["pp_schedule"], "1f1b");
  ASSERT_TRUE(j.contains("pp_layers"));
  EXPECT_TRUE(j["pp_layers"].is_array() && j["pp_layers"].empty());
  EXPECT_EQ(j["device"], "cuda");
  EXPECT_EQ(j["deterministic"], true);
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 80000);
  EXPECT_DOUBLE_EQ(j["tokens_per_s_per_gpu"].get<double>(), 20000);
  EXPECT_DOUBLE_EQ(j["final_loss"].get<double>(), 3.25);
  EXPECT_EQ(j["steps_timed"], 1);
  EXPECT_EQ(j["first_step_timed"], false);
  EXPECT_GT(j["total_params"].get<double>(), j["active_params"].get<double>());  // 16 experts, top-k of them
  ASSERT_EQ(j["split"].size(), 1u);
  EXPECT_EQ(j["split"][0]["kind"], "expert GEMMs");
  EXPECT_DOUBLE_EQ(j["split"][0]["rate"].get<double>(), 600);
  EXPECT_DOUBLE_EQ(j["ceilings"]["copy_tb_s"].get<double>(), 4.1);

  EXPECT_TRUE(j["power"].is_null());  // no NVML window

  // Two GPUs (ranks 0 and 1 share the first, rank 2 has the second): the energy summed over them,
  // the job's tokens per joule (its global batch x seq_len tokens per step), each GPU listed.
  ClockTally clocks;
  clocks.add({1790, kClockReasonPowerCap});
  clocks.add({1980, 0});
  RankPower a{true, summarize_power(clocks, EnergyWindow{true, 0.8, 480.0, 7}, 700.0, 1980.0), ""};
  a.summary.gpu = "0000:19:00.0";
  a.summary.host = "node-a";
  RankPower b = a;
  b.summary.gpu = "0000:3B:00.0";
  b.summary.energy_j = 560.0;  // 700 W
  const JobPower two_gpus = combine_power({a, a, b});
  const auto p = nlohmann::json::parse(bench_report_json(cfg, two_steps(), 3, {}, c, &two_gpus))["power"];
  EXPECT_EQ(p["gpus"], 2);
  EXPECT_DOUBLE_EQ(p["energy_j_per_step"].get<double>(), 650.0);  // (600 W + 700 W) x 0.5 s steps
  EXPECT_DOUBLE_EQ(p["mean_w_per_gpu"].get<double>(), 650.0);
  const double tokens = static_cast<double>(cfg.train.global_batch_size * cfg.train.seq_len);
  EXPECT_DOUBLE_EQ(p["tokens_per_j"].get<double>(), tokens / 650.0);
  EXPECT_TRUE(p["unmeasured"].empty());
  ASSERT_EQ(p["per_gpu"].size(), 2u);
  const auto g = p["per_gpu"][0];
  EXPECT_EQ(g["gpu"], "0000:19:00.0");
  EXPECT_EQ(g["host"], "node-a");
  EXPECT_DOUBLE_EQ(g["energy_j_per_step"].get<double>(), 300.0);  // 600 W for 0.5 s steps
  EXPECT_DOUBLE_EQ(g["mean_w"].get<double>(), 600.0);             // 480 J over 0.8 s
  EXPECT_EQ(g["energy_updates"], 7);
  EXPECT_DOUBLE_EQ(g["limit_w"].get<double>(), 700.0);
  EXPECT_DOUBLE_EQ(g["sm_clock_mhz_mean"].get<double>(), 1885.0);
  EXPECT_EQ(g["samples"], 2);
  EXPECT_EQ(g["power_capped_samples"], 1);
  EXPECT_EQ(g["thermal_samples"], 0);
  // Too few counter updates on one GPU: its energy fields and the job's sums are null, the clock's stay.
  b.summary.energy_measured = false;
  const JobPower partial = combine_power({a, b});
  const auto q = nlohmann::json::parse(bench_report_json(cfg, two_steps(), 2, {}, c, &partial))["power"];
  EXPECT_TRUE(q["energy_j_per_step"].is_null());
  EXPECT_TRUE(q["tokens_per_j"].is_null());
  EXPECT_TRUE(q["per_gpu"][1]["energy_j_per_step"].is_null());
  EXPECT_TRUE(q["per_gpu"][1]["mean_w"].is_null());
  EXPECT_FALSE(q["per_gpu"][0]["energy_j_per_step"].is_null());
  EXPECT_EQ(q["per_gpu"][1]["samples"], 2);
  // A rank that read no GPU is named.
  const JobPower missing = combine_power({a, RankPower{false, {}, "NVML not found"}});
  const auto m = nlohmann::json::parse(bench_report_json(cfg, two_steps(), 2, {}, c, &missing))["power"];
  ASSERT_EQ(m["unmeasured"].size(), 1u);
  EXPECT_EQ(m["unmeasured"][0], "rank 1: NVML not found");
  EXPECT_TRUE(m["energy_j_per_step"].is_null());
  // No rank read its GPU: the reasons are still in the report.
  const JobPower none = combine_power({RankPower{false, {}, "NVML not found"}});
  const auto n = nlohmann::json::parse(bench_report_json(cfg, two_steps(), 1, {}, c, &none))["power"];
  EXPECT_EQ(n["gpus"], 0);
  EXPECT_EQ(n["unmeasured"][0], "rank 0: NVML not found");

  cfg.parallel.mode = "fsdp";
  EXPECT_EQ(nlohmann::json::parse(bench_report_json(cfg, two_steps(), 4, {}, c, nullptr))["ep"], 1);
  EXPECT_THROW(bench_report_json(cfg, TrainSummary{}, 4, {}, c, nullptr), Error);  // no steps: nothing to report
}

TEST(BenchReport, is_written_whole_or_not_at_all) {
  testing::TempDir dir;
  const Config cfg = testing::small_config(dir.path);
  const std::string path = dir.path + "/report.json";
  write_bench_report(path, cfg, two_steps(), 1, {}, Ceilings{}, nullptr);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(nlohmann::json::parse(text.str())["tokens_per_s_per_gpu"].get<double>(), 80000);
  const std::string bad = dir.path + "/no/such/dir/report.json";
  EXPECT_THROW(write_bench_report(bad, cfg, two_steps(), 1, {}, Ceilings{}, nullptr), Error);
  EXPECT_FALSE(std::filesystem::exists(bad));
}

}  // namespace
}  // namespace moe

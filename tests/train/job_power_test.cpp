// bench's power line over a job's GPUs (core/power_summary.h: combine_power, format_job_power;
// train/job_power.h: the record each rank sends): each GPU counted once however many ranks share
// it, the energy summed over the GPUs, the job's tokens per joule, and what is missing named.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "moe/comm/local_communicator.h"
#include "moe/core/power_summary.h"
#include "moe/train/job_power.h"

namespace moe {
namespace {

// A GPU's window: `watts` for 1.5 s, its clock samples all held by the power cap.
PowerSummary gpu_at(const std::string& bus_id, double watts, int64_t samples = 10) {
  PowerSummary p;
  p.gpu = bus_id;
  p.energy_measured = true;
  p.seconds = 1.5;
  p.energy_j = watts * 1.5;
  p.energy_updates = 15;
  p.limit_w = 700;
  p.max_sm_clock_mhz = 1980;
  p.mean_sm_clock_mhz = 1750;
  p.samples = samples;
  p.power_capped = samples;
  return p;
}

RankPower measured(const PowerSummary& p) { return RankPower{true, p, ""}; }

TEST(JobPower, ranks_sharing_a_gpu_count_it_once_and_the_energy_is_summed_over_gpus) {
  // Ranks 0 and 1 share GPU A (both report it), rank 2 has GPU B: two GPUs.
  const JobPower job = combine_power({measured(gpu_at("0000:19:00.0", 600)), measured(gpu_at("0000:19:00.0", 610)),
                                      measured(gpu_at("0000:3B:00.0", 700))});
  ASSERT_EQ(job.gpus.size(), 2u);
  EXPECT_EQ(job.gpus[0].gpu, "0000:19:00.0");
  EXPECT_DOUBLE_EQ(job.gpus[0].mean_power_w(), 600.0);  // the first rank's window of that GPU
  EXPECT_EQ(job.ranks, 3);
  EXPECT_TRUE(job.energy_measured());
  // 0.2 s steps: 120 J + 140 J.
  EXPECT_DOUBLE_EQ(job.energy_per_step_j(0.2), 260.0);
  EXPECT_DOUBLE_EQ(job.mean_power_per_gpu_w(), 650.0);
  // The job's 65536 tokens per step over 260 J: 252 tokens/J.
  const std::string line = format_job_power(job, 0.2, 65536);
  std::cout << line;
  EXPECT_NE(line.find("power (2 GPUs of 3 ranks, NVML): 260.0 J per step summed (252 tokens/J), 650 W mean per "
                      "GPU against a 700 W limit each"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("power cap in 20 of 20 samples"), std::string::npos) << line;
}

// Identical servers give their GPUs identical bus ids: the host tells them apart.
TEST(JobPower, the_same_bus_id_on_two_hosts_is_two_gpus) {
  PowerSummary a = gpu_at("0000:19:00.0", 600), b = gpu_at("0000:19:00.0", 700);
  a.host = "node-a", b.host = "node-b";
  PowerSummary a_again = a;
  a_again.energy_j = 0;  // a second rank on node-a's GPU: not counted again
  const JobPower job = combine_power({measured(a), measured(a_again), measured(b)});
  ASSERT_EQ(job.gpus.size(), 2u);
  EXPECT_EQ(job.gpus[1].host, "node-b");
  EXPECT_DOUBLE_EQ(job.energy_per_step_j(0.2), 260.0);  // 120 J + 140 J
}

TEST(JobPower, one_gpu_shared_by_every_rank_gives_the_job_tokens_over_that_gpu_energy) {
  const JobPower job = combine_power({measured(gpu_at("0000:19:00.0", 700)), measured(gpu_at("0000:19:00.0", 700))});
  ASSERT_EQ(job.gpus.size(), 1u);
  // 140 J per 0.2 s step for the job's 32768 tokens (not half of them: the GPU ran both ranks).
  const std::string line = format_job_power(job, 0.2, 32768);
  EXPECT_NE(line.find("power (the GPU of all 2 ranks, NVML): 140.0 J per step (234 tokens/J)"), std::string::npos)
      << line;
  const std::string alone = format_job_power(combine_power({measured(gpu_at("0000:19:00.0", 700))}), 0.2, 32768);
  EXPECT_NE(alone.find("power (the GPU, NVML): 140.0 J per step"), std::string::npos) << alone;
}

TEST(JobPower, a_rank_without_a_window_is_named_and_no_sum_is_printed) {
  const JobPower job = combine_power(
      {measured(gpu_at("0000:19:00.0", 700)), RankPower{false, {}, "NVML does not know the GPU at 0000:3B:00.0"}});
  EXPECT_FALSE(job.energy_measured());
  EXPECT_EQ(job.energy_per_step_j(0.2), 0.0);
  const std::string line = format_job_power(job, 0.2, 32768);
  std::cout << line;
  EXPECT_NE(line.find("power (1 GPU of 2 ranks, NVML)"), std::string::npos) << line;
  EXPECT_EQ(line.find("J per step"), std::string::npos) << line;
  EXPECT_NE(line.find("energy not summed (not every rank's GPU was read)"), std::string::npos) << line;
  EXPECT_NE(line.find("no window on rank 1: NVML does not know the GPU at 0000:3B:00.0\n"), std::string::npos) << line;

  // A GPU whose counter did not advance twice: its energy is unknown, so is the sum.
  PowerSummary short_window = gpu_at("0000:3B:00.0", 700);
  short_window.energy_measured = false;
  const JobPower part = combine_power({measured(gpu_at("0000:19:00.0", 700)), measured(short_window)});
  EXPECT_FALSE(part.energy_measured());
  EXPECT_NE(format_job_power(part, 0.2, 32768).find("counter advanced fewer than twice"), std::string::npos);

  const std::string none = format_job_power(combine_power({RankPower{false, {}, "NVML not found"}}), 0.2, 32768);
  EXPECT_EQ(none, "  power: not recorded (rank 0: NVML not found)\n");
}

TEST(JobPower, a_ranks_record_reads_back_every_field) {
  PowerSummary p = gpu_at("0000:19:00.0", 654.25, 37);
  p.host = "node-\xff";  // not UTF-8: replaced in the record, never a throw before the collective
  p.thermal = 2, p.hardware_slowdown = 1, p.note = "nvmlDeviceGetClockInfo failed: \"Unknown\"";
  const RankPower back = parse_power_record(power_record(p, ""));
  ASSERT_TRUE(back.measured);
  EXPECT_EQ(back.summary.host, "node-\xef\xbf\xbd");  // U+FFFD
  EXPECT_EQ(back.summary.gpu, p.gpu);
  EXPECT_EQ(back.summary.energy_measured, p.energy_measured);
  EXPECT_EQ(back.summary.seconds, p.seconds);
  EXPECT_EQ(back.summary.energy_j, p.energy_j);
  EXPECT_EQ(back.summary.energy_updates, p.energy_updates);
  EXPECT_EQ(back.summary.limit_w, p.limit_w);
  EXPECT_EQ(back.summary.max_sm_clock_mhz, p.max_sm_clock_mhz);
  EXPECT_EQ(back.summary.mean_sm_clock_mhz, p.mean_sm_clock_mhz);
  EXPECT_EQ(back.summary.samples, p.samples);
  EXPECT_EQ(back.summary.power_capped, p.power_capped);
  EXPECT_EQ(back.summary.thermal, p.thermal);
  EXPECT_EQ(back.summary.hardware_slowdown, p.hardware_slowdown);
  EXPECT_EQ(back.summary.note, p.note);
  const RankPower none = parse_power_record(power_record(std::nullopt, "no GPU"));
  EXPECT_FALSE(none.measured);
  EXPECT_EQ(none.why, "no GPU");

  LocalCommunicator one;
  const JobPower job = gather_job_power(one, p, "");
  ASSERT_EQ(job.gpus.size(), 1u);
  EXPECT_EQ(job.gpus[0].energy_j, p.energy_j);
}

}  // namespace
}  // namespace moe

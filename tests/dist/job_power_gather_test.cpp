// ranks: 2 3
// bench's power line gathers every rank's window (train/job_power.h): ranks that report the same
// GPU count it once, ranks on their own GPUs are summed, and a rank without a window is named on
// every rank. NVML is not involved: the windows are made up here.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "moe/comm/mpi_communicator.h"
#include "moe/train/job_power.h"

namespace moe {
namespace {

PowerSummary window_on(const std::string& bus_id, double watts) {
  PowerSummary p;
  p.gpu = bus_id;
  p.energy_measured = true;
  p.seconds = 2.0;
  p.energy_j = 2.0 * watts;
  p.energy_updates = 20;
  p.limit_w = 700;
  p.samples = 5;
  return p;
}

TEST(JobPowerGather, OneGpuPerRankIsSummedAndASharedGpuCountsOnce) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const int n = world.size();
  const JobPower own = gather_job_power(world, window_on("gpu-" + std::to_string(world.rank()), 600), "");
  ASSERT_EQ(own.gpus.size(), static_cast<size_t>(n));
  EXPECT_DOUBLE_EQ(own.energy_per_step_j(0.1), 60.0 * n);
  for (int r = 0; r < n; ++r) EXPECT_EQ(own.gpus[static_cast<size_t>(r)].gpu, "gpu-" + std::to_string(r));

  const JobPower shared = gather_job_power(world, window_on("gpu-0", 600 + world.rank()), "");
  ASSERT_EQ(shared.gpus.size(), 1u);
  EXPECT_DOUBLE_EQ(shared.gpus[0].mean_power_w(), 600.0);  // rank 0's window of it
  EXPECT_EQ(shared.ranks, n);
}

TEST(JobPowerGather, ARankWithoutAWindowIsNamedOnEveryRank) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const bool last = world.rank() == world.size() - 1;
  const JobPower job = last ? gather_job_power(world, std::nullopt, "NVML not found")
                            : gather_job_power(world, window_on("gpu-" + std::to_string(world.rank()), 600), "");
  EXPECT_FALSE(job.energy_measured());
  ASSERT_EQ(job.unmeasured.size(), 1u);
  EXPECT_EQ(job.unmeasured[0], "rank " + std::to_string(world.size() - 1) + ": NVML not found");
}

}  // namespace
}  // namespace moe

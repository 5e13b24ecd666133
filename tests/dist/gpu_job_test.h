// For GPU tests under mpirun: a fixture that skips where no GPU or no NCCL is usable, and the
// small GPU model they train.
//
// Where the job has more ranks than the machine has GPUs (the one-H200 machine), the ranks share a
// GPU. NCCL refuses two ranks of one host on one GPU, so each rank gets its own NCCL_HOSTID (NCCL
// then takes the ranks for separate hosts and moves their data over its socket transport on the
// loopback interface), set before the first NCCL call; values already in the environment win.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "job_temp_dir_test.h"
#include "moe/comm/nccl_communicator.h"
#include "moe/core/device.h"

namespace moe::testing {

inline void share_gpu_if_needed(int rank, int ranks) {
  if (cuda_device_count() >= ranks) return;
  setenv("NCCL_HOSTID", ("moetrain-test-rank-" + std::to_string(rank)).c_str(), 0);
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  setenv("NCCL_IB_DISABLE", "1", 0);
}

class GpuJobTest : public JobTempDirTest {
 protected:
  void SetUp() override {
    JobTempDirTest::SetUp();
    std::string why;
    if (!cuda_available(&why) || !nccl_available(&why)) GTEST_SKIP() << why;
    share_gpu_if_needed(world_->rank(), world_->size());
  }
};

// Head dim 16 (cuDNN needs a multiple of 8); 4 layers, the first dense, then MoE layers of 8
// experts top-2 with a shared expert, no drops; 4 microbatches of 2 sequences of 64 tokens per
// step on one rank.
inline std::vector<std::string> gpu_model_overrides(int steps) {
  return {"run.device=\"cuda\"",
          "model.hidden_size=64",
          "model.intermediate_size=64",
          "model.num_hidden_layers=4",
          "model.first_k_dense_replace=1",
          "model.dense_intermediate_size=128",
          "model.shared_expert_intermediate_size=64",
          "model.dropless=true",
          "train.seq_len=64",
          "train.micro_batch_size=2",
          "train.global_batch_size=8",
          "train.lr=3e-3",
          "train.steps=" + std::to_string(steps)};
}

}  // namespace moe::testing

// For GPU tests under mpirun: where the job has more ranks than the machine has GPUs (the
// one-H200 machine), the ranks share a GPU. NCCL refuses two ranks of one host on one GPU, so each
// rank gets its own NCCL_HOSTID (NCCL then takes the ranks for separate hosts and moves their data
// over its socket transport on the loopback interface). Call before the first NCCL call; values
// already in the environment win.
#pragma once

#include <cstdlib>
#include <string>

#include "moe/core/device.h"

namespace moe::testing {

inline void share_gpu_if_needed(int rank, int ranks) {
  if (cuda_device_count() >= ranks) return;
  setenv("NCCL_HOSTID", ("moetrain-test-rank-" + std::to_string(rank)).c_str(), 0);
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  setenv("NCCL_IB_DISABLE", "1", 0);
}

}  // namespace moe::testing

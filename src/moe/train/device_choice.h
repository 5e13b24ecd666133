// Which device a run trains on (run.device), and the communicator its collectives go through
// there: on the GPU, NCCL over the job's ranks (bootstrapped through the host world), so that
// one GPU runs the same collectives as eight.
#pragma once

#include <memory>
#include <string>

#include "moe/comm/communicator.h"
#include "moe/core/tensor.h"
#include "moe/train/config.h"

namespace moe {

struct RunDevice {
  Device device = Device::CPU;
  std::string note;  // why this device, for the start-up printout
  // GPU runs with NCCL: the run's world (device buffers); null when the run uses the host world.
  std::unique_ptr<Communicator> gpu_world;
};

// run.device = auto takes the GPU when this build has CUDA and one is usable (several ranks
// also need NCCL, and expert parallelism on the GPU the rowwise backend); "cuda" insists and
// fails naming the reason. Collective over `world` when it picks the GPU (NCCL bootstrap).
RunDevice choose_device(const Config& cfg, Communicator& world);

}  // namespace moe

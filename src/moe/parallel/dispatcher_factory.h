// Picks the token-dispatch backend by name (`ep.backend`): local (EP = 1), rowwise (symmetric
// heap, the default for EP > 1) or alltoall (the all-to-all baseline).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "moe/comm/communicator.h"
#include "moe/model/dispatch.h"

namespace moe {

// ep_group: the EP group this rank belongs to (size 1 for local). Throws listing the backends
// for an unknown name, and when local is asked for an EP group of more than one rank.
std::unique_ptr<TokenDispatcher> make_dispatcher(const std::string& backend, Communicator& ep_group,
                                                 int64_t num_experts, double capacity_factor, bool dropless);

// The GPU backends (activations and expert rows on the device, BF16): rowwise runs on an NCCL
// symmetric heap (CudaRowwiseDispatcher; ep_group must be an NCCL communicator, EP = 1 included);
// alltoall (host-side counts, not capturable) is refused. (The LocalDispatcher runs on the GPU as
// well: its ops run on the device of their tensors.)
std::unique_ptr<TokenDispatcher> make_gpu_dispatcher(const std::string& backend, Communicator& ep_group,
                                                     int64_t num_experts, double capacity_factor, bool dropless);

// The dispatcher of a run, the one place that chooses: ep_group null (the FSDP baseline, every
// expert on every rank) or a model without MoE layers -> local; on the GPU with device
// collectives (NCCL) -> the GPU rowwise backend at every EP degree, EP = 1 included (counts
// agreed on the device, capturable); otherwise EP = 1 -> local; EP > 1 -> `backend` on the CPU,
// and on a GPU without NCCL the GPU backend, which then explains why it cannot run.
std::unique_ptr<TokenDispatcher> make_run_dispatcher(Device device, bool device_collectives, bool has_moe_layers,
                                                     const std::string& backend, Communicator* ep_group,
                                                     int64_t num_experts, double capacity_factor, bool dropless);

}  // namespace moe

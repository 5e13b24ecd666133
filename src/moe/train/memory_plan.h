// Memory planning: one rank's bytes by role, read from the arenas of the objects a run builds
// (run_model.h), and the question `moetrain plan` and a run that does not fit both answer: what
// takes the memory, and which of moment_dtype, recompute, a larger EP or a smaller microbatch
// would make it fit. Options are planned, not estimated: each is the same build on a
// PlanCommunicator, so its bytes are the bytes that run would reserve.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "moe/core/arena.h"
#include "moe/core/device.h"
#include "moe/model/dispatch.h"
#include "moe/parallel/param_store.h"
#include "moe/train/config.h"

namespace moe {

// Device memory kept out of a GPU run's arenas: cuBLASLt and cuDNN workspaces, NCCL buffers.
constexpr size_t kLibraryReserveBytes = size_t{2} << 30;

struct MemoryRoles {
  size_t parameters = 0;       // FP32 master weights (this rank's)
  size_t compute_weights = 0;  // what the products read: the BF16 copy (GPU); in FP8 the FP8 caches
                               // (plus, on the GPU, a BF16 copy of the unquantized tensors only)
  size_t gradients = 0;
  size_t optimizer = 0;        // the optimizer's buffers: AdamW moments, schedule, and under ZeRO-1 the
                               // gradient shard and the reduce/gather staging
  size_t other_state = 0;      // router bias and load, step buffers, FSDP gather buffers; on the CPU
                               // also the trainer's host copy of the step's batch
  size_t activations = 0;      // the activation arena (saved activations, scratch, expert buffers in it)
  size_t expert_buffers = 0;   // the expert buffers: their part of the activation arena plus the heap
  size_t heap = 0;             // the dispatcher's symmetric heap, outside the arenas
  size_t library_workspace = 0;  // outside the arenas and beyond kLibraryReserveBytes: cuDNN's
                                 // deterministic attention backward (train.deterministic)
  size_t state() const { return parameters + compute_weights + gradients + optimizer + other_state; }
  size_t total() const { return state() + activations + heap + library_workspace; }
};

struct RunModel;
MemoryRoles memory_roles(const Arena& state, const Arena& acts, const RunModel& run);

// Rank `rank` of `world_size` running `cfg` on `device`: built, reserved, never allocated, no
// collective. Throws what a run would throw for a config that cannot run at this size.
// use = Evaluation: what `moetrain eval` builds (the weights, no gradients or optimizer state).
MemoryRoles plan_rank(const Config& cfg, int world_size, int rank, Device device, StoreUse use = StoreUse::Training);

// The largest plan over the ranks of `world_size`: every pipeline stage's, and within a stage the
// larger of its first and last rank (they differ only by the remainders of shards).
MemoryRoles plan_largest_rank(const Config& cfg, int world_size, Device device,
                              StoreUse use = StoreUse::Training);

// One way to change the config, planned.
struct FitOption {
  std::vector<std::pair<std::string, std::string>> changes;  // key, TOML value
  MemoryRoles plan;                                          // the largest rank's
  bool fits = false;
  int cost = 0;  // an ordering by expected step-time cost: moment_dtype < recompute < ep, micro_batch_size
  std::string describe() const;  // optim.moment_dtype = "bf16" + train.recompute = "block"
  std::string set_flags() const;  // --set optim.moment_dtype=bf16 --set train.recompute=block
};

// Each lever alone (moment_dtype = bf16, each recompute mode that keeps less, each larger EP that
// divides the world and the experts, each smaller micro_batch_size that divides the current one),
// then the cheapest combination that fits, if no single lever does; `usable`: bytes a rank may plan for.
// An evaluation (use = Evaluation) has no moments: moment_dtype is not offered.
std::vector<FitOption> fit_options(const Config& cfg, int world_size, Device device, size_t usable,
                                   StoreUse use = StoreUse::Training);

// The error for a plan over `usable`: the bytes by role and the options above, computed.
std::string does_not_fit_message(const Config& cfg, const MemoryRoles& plan, int world_size, Device device,
                                 size_t usable, StoreUse use = StoreUse::Training);

// `moetrain plan`: every rank's plan by role (equal ranks on one line), whether it fits in
// `memory_per_rank` (the memory free on each device when the run starts; kLibraryReserveBytes of
// it stay out of the plan on the GPU), and the options of fit_options. use = Evaluation: `plan
// --eval`, what `moetrain eval` of this config would hold.
std::string plan_report(const Config& cfg, int world_size, Device device, size_t memory_per_rank,
                        StoreUse use = StoreUse::Training);

}  // namespace moe

// The multi-rank save protocol, one call on every rank:
//   rank 0       creates <run>/.tmp-step-S                          then a barrier;
//   every rank   writes the slices it owns into rank-RRRRR.safetensors (streamed: a slice's bytes
//                are produced just before they are written, so device state never needs a full
//                host copy) and sends its chunk records to rank 0 through one gather;
//   rank 0       writes index.json and train_state.json and renames the directory (the commit
//                point)                                             then a barrier.
// Loading needs no protocol: every rank opens the checkpoint with CheckpointReader and reads the
// ranges it holds under its own topology.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/ckpt/checkpoint.h"
#include "moe/comm/communicator.h"

namespace moe {

// host: the job's ranks on host buffers (MPI, or the one-process communicator). Slices whose data
// is null are produced by `produce`. train_state is read on rank 0. Returns the committed
// checkpoint directory (on every rank).
std::string save_checkpoint_collective(Communicator& host, const std::string& run_dir, int64_t step,
                                       const std::vector<CheckpointSlice>& slices, const SliceProducer& produce,
                                       const nlohmann::json& train_state);

}  // namespace moe

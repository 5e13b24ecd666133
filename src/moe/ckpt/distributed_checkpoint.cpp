#include "moe/ckpt/distributed_checkpoint.h"

#include "moe/comm/host_strings.h"
#include "moe/core/error.h"

namespace moe {

std::string save_checkpoint_collective(Communicator& host, const std::string& run_dir, int64_t step,
                                       const std::vector<CheckpointSlice>& slices, const SliceProducer& produce,
                                       const nlohmann::json& train_state) {
  const bool leader = host.rank() == 0;
  std::string tmp = leader ? begin_checkpoint(run_dir, step) : std::string();
  tmp = broadcast_string(host, tmp, 0);  // the barrier: no rank writes before the directory exists
  // NOTES: a failed save (a full disk) leaves no temp directory behind once no rank writes into
  // it: alone, or after the gather. Removed while other ranks still write, their next file would
  // fail with a misleading "No such file or directory"; the next start clears that case.
  bool others_writing = host.size() > 1;
  std::string dir;
  try {
    const std::vector<CheckpointChunk> mine = write_rank_file(tmp, host.rank(), slices, produce);
    const std::vector<std::string> records = all_gather_strings(host, chunks_to_json(mine).dump());
    others_writing = false;
    if (leader) {
      std::vector<CheckpointChunk> all;
      for (size_t r = 0; r < records.size(); ++r) {
        const std::vector<CheckpointChunk> theirs = r == 0 ? mine : chunks_from_json(nlohmann::json::parse(records[r]));
        all.insert(all.end(), theirs.begin(), theirs.end());
      }
      write_checkpoint_index(tmp, step, all, train_state);
      dir = commit_checkpoint(run_dir, step);
    }
  } catch (...) {
    if (leader && !others_writing) abandon_checkpoint(run_dir, step);
    throw;
  }
  return broadcast_string(host, dir, 0);  // the barrier: every rank returns after the commit
}

}  // namespace moe

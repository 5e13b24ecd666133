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
  const std::vector<CheckpointChunk> mine = write_rank_file(tmp, host.rank(), slices, produce);
  const std::vector<std::string> records = all_gather_strings(host, chunks_to_json(mine).dump());
  std::string dir;
  if (leader) {
    std::vector<CheckpointChunk> all;
    for (size_t r = 0; r < records.size(); ++r) {
      const std::vector<CheckpointChunk> theirs = r == 0 ? mine : chunks_from_json(nlohmann::json::parse(records[r]));
      all.insert(all.end(), theirs.begin(), theirs.end());
    }
    write_checkpoint_index(tmp, step, all, train_state);
    dir = commit_checkpoint(run_dir, step);
  }
  return broadcast_string(host, dir, 0);  // the barrier: every rank returns after the commit
}

}  // namespace moe

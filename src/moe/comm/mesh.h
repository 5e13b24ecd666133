// The parallel layout (pipeline size 1): world = dp ranks. Dense mesh:
// the dp group (all ranks). MoE mesh: dp = ep_dp x ep_mp with the ep_mp ranks contiguous
// (rank = ep_dp_index * ep + ep_index), so an EP group sits inside one node.
//   dense replica group = world            (dense gradients are reduced over it)
//   ep group            = ranks with the same ep_dp_index (they hold different expert slices)
//   expert replica group = ranks with the same ep_index (they hold the same expert slice)
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "moe/comm/communicator.h"

namespace moe {

struct Mesh {
  int world_size = 1, rank = 0;
  int ep = 1;         // ep_mp: ranks in one expert-parallel group
  int ep_dp = 1;      // replicas of each expert slice = world_size / ep
  int ep_index = 0;   // this rank's position in its ep group (which expert slice it holds)
  int ep_dp_index = 0;
  Communicator* world = nullptr;                 // not owned
  std::unique_ptr<Communicator> ep_group;        // size ep
  std::unique_ptr<Communicator> expert_replicas; // size ep_dp

  int dp() const { return world_size; }
};

// Builds the mesh; throws naming what would work when ep does not divide the world size or the
// expert count (e.g. "parallel.ep = 3 does not divide 4 ranks; use 1, 2 or 4").
Mesh make_mesh(Communicator& world, int ep, int64_t num_experts);
// The same layout for memory planning: `world` is a PlanCommunicator (no collective is made) and
// so are the groups, with the ranks and sizes make_mesh's splits would give.
Mesh plan_mesh(Communicator& world, int ep, int64_t num_experts);

}  // namespace moe

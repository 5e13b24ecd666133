// The parallel layout: job = pp stages x dp ranks, the stages contiguous (job rank = stage * dp +
// rank). Inside a stage, as without pipeline: the dense mesh is the stage's dp group; the MoE mesh
// is dp = ep_dp x ep_mp with the ep_mp ranks contiguous (rank = ep_dp_index * ep + ep_index), so an
// EP group sits inside one node. Fields below are the stage's (rank, world_size, world: within it).
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
  int pp = 1;         // pipeline stages
  int stage = 0;      // this rank's stage
  Communicator* world = nullptr;                 // this stage's dp ranks (pp = 1: the job; not owned)
  std::unique_ptr<Communicator> ep_group;        // size ep
  std::unique_ptr<Communicator> expert_replicas; // size ep_dp
  Communicator* job = nullptr;                   // every rank of every stage (not owned)
  std::unique_ptr<Communicator> stage_group;     // pp > 1: owns what `world` points at
  std::unique_ptr<Communicator> pipeline;        // pp > 1: the pp ranks with this rank's dp index, by stage

  int dp() const { return world_size; }
  // The ranks a global quantity spans (the gradient norm, the non-finite skip): the whole job.
  Communicator& all_stages() const { return job ? *job : *world; }
};

// Builds the mesh; throws naming what would work when pp does not divide the job's ranks, or ep
// the ranks of a stage or the expert count (e.g. "parallel.ep = 3 does not divide 4 ranks; use 1,
// 2 or 4").
Mesh make_mesh(Communicator& world, int ep, int64_t num_experts, int pp = 1);
// make_mesh's checks alone, with no communicator: they depend on the sizes only, so every rank
// of a job meets the same error (the Trainer checks them among its agreed start-up errors).
void check_mesh(int job_size, int ep, int64_t num_experts, int pp = 1);
// The same layout for memory planning: `world` is a PlanCommunicator (no collective is made) and
// so are the groups, with the ranks and sizes make_mesh's splits would give.
Mesh plan_mesh(Communicator& world, int ep, int64_t num_experts, int pp = 1);

}  // namespace moe

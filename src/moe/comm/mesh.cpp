// make_mesh: checks the EP size against the world and the expert count, then splits the world
// into ep groups (contiguous ranks) and expert replica groups (strided ranks).
#include "moe/comm/mesh.h"

#include <sstream>

#include "moe/comm/plan_communicator.h"

namespace moe {

namespace {

// "1, 2, 4": the EP sizes that divide both the world size and the expert count.
std::string valid_ep_sizes(int world_size, int64_t num_experts) {
  std::ostringstream os;
  bool first = true;
  for (int d = 1; d <= world_size; ++d) {
    if (world_size % d != 0 || num_experts < d || num_experts % d != 0) continue;
    os << (first ? "" : ", ") << d;
    first = false;
  }
  return os.str();
}

// The layout of job rank `job_rank` of `job_size`, checked; the group communicators are left to the caller.
Mesh mesh_layout(int job_size, int job_rank, int ep, int64_t num_experts, int pp) {
  MOE_CHECK(pp >= 1 && job_size % pp == 0, "parallel.pp = ", pp, " does not divide the ", job_size,
            " ranks; use one of ", valid_ep_sizes(job_size, job_size));
  const int world_size = job_size / pp, rank = job_rank % world_size;
  MOE_CHECK(num_experts >= 1, "model.num_experts = ", num_experts, " must be at least 1");
  const std::string use = "; use one of " + valid_ep_sizes(world_size, num_experts);
  MOE_CHECK(ep >= 1, "parallel.ep = ", ep, " must be at least 1", use);
  // Under pipeline stages the EP mesh lives inside each stage: say so, or "the 1 ranks" of a
  // 2-rank job reads as a miscount.
  const std::string ranks = pp == 1 ? " ranks"
                                    : " ranks of each pipeline stage (" + std::to_string(job_size) +
                                          " ranks / parallel.pp = " + std::to_string(pp) + "; a smaller parallel.pp "
                                          "leaves more)";
  MOE_CHECK(world_size % ep == 0, "parallel.ep = ", ep, " does not divide the ", world_size, ranks, use);
  MOE_CHECK(num_experts >= ep, "parallel.ep = ", ep, " exceeds model.num_experts = ", num_experts,
            " (every EP rank needs at least one expert)", use);
  MOE_CHECK(num_experts % ep == 0, "parallel.ep = ", ep, " does not divide model.num_experts = ",
            num_experts, " (every EP rank holds the same number of experts)", use);

  Mesh mesh;
  mesh.pp = pp;
  mesh.stage = job_rank / world_size;
  mesh.world_size = world_size;
  mesh.rank = rank;
  mesh.ep = ep;
  mesh.ep_dp = world_size / ep;
  mesh.ep_index = mesh.rank % ep;
  mesh.ep_dp_index = mesh.rank / ep;
  return mesh;
}

}  // namespace

Mesh make_mesh(Communicator& world, int ep, int64_t num_experts, int pp) {
  Mesh mesh = mesh_layout(world.size(), world.rank(), ep, num_experts, pp);
  mesh.job = &world;
  mesh.world = &world;
  // Every split is collective over the job, in this order on every rank.
  if (pp > 1) {
    mesh.stage_group = world.split(/*color=*/mesh.stage, /*key=*/mesh.rank);
    mesh.pipeline = world.split(/*color=*/mesh.rank, /*key=*/mesh.stage);
    mesh.world = mesh.stage_group.get();
  }
  Communicator& stage = *mesh.world;
  mesh.ep_group = stage.split(/*color=*/mesh.ep_dp_index, /*key=*/mesh.rank);
  mesh.expert_replicas = stage.split(/*color=*/mesh.ep_index, /*key=*/mesh.rank);
  return mesh;
}

void check_mesh(int job_size, int ep, int64_t num_experts, int pp) {
  (void)mesh_layout(job_size, 0, ep, num_experts, pp);
}

Mesh plan_mesh(Communicator& world, int ep, int64_t num_experts, int pp) {
  Mesh mesh = mesh_layout(world.size(), world.rank(), ep, num_experts, pp);
  mesh.job = &world;
  mesh.world = &world;
  if (pp > 1) {
    mesh.stage_group = std::make_unique<PlanCommunicator>(mesh.rank, mesh.world_size);
    mesh.pipeline = std::make_unique<PlanCommunicator>(mesh.stage, pp);
    mesh.world = mesh.stage_group.get();
  }
  mesh.ep_group = std::make_unique<PlanCommunicator>(mesh.ep_index, mesh.ep);
  mesh.expert_replicas = std::make_unique<PlanCommunicator>(mesh.ep_dp_index, mesh.ep_dp);
  return mesh;
}

}  // namespace moe

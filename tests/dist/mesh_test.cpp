// ranks: 4
// make_mesh over 4 ranks: ep groups are contiguous ranks, expert replica groups strided ones,
// and EP sizes that cannot work are refused with a message that names what would.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "moe/comm/local_communicator.h"
#include "moe/comm/mesh.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/comm/plan_communicator.h"

namespace moe {
namespace {

MpiCommunicator& world() {
  static MpiCommunicator comm(MPI_COMM_WORLD);
  return comm;
}

// World ranks of a group's members, in group order.
std::vector<int32_t> members(Communicator& group) {
  std::vector<int32_t> in{world().rank()}, out(group.size(), -1);
  group.all_gather(i32_tensor(out.data(), {group.size()}), i32_tensor(in.data(), {1}));
  return out;
}

template <typename Fn>
void expect_error(Fn fn, const std::string& expected) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing: " << expected;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << expected;
  }
}

class MeshLayout : public ::testing::TestWithParam<int> {};

TEST_P(MeshLayout, groups_are_contiguous_ep_and_strided_replicas) {
  ASSERT_EQ(world().size(), 4) << "this test is written for 4 ranks";
  const int ep = GetParam(), r = world().rank();
  Mesh mesh = make_mesh(world(), ep, /*num_experts=*/8);
  EXPECT_EQ(mesh.world_size, 4);
  EXPECT_EQ(mesh.dp(), 4);
  EXPECT_EQ(mesh.rank, r);
  EXPECT_EQ(mesh.ep, ep);
  EXPECT_EQ(mesh.ep_dp, 4 / ep);
  EXPECT_EQ(mesh.ep_index, r % ep);
  EXPECT_EQ(mesh.ep_dp_index, r / ep);
  EXPECT_EQ(mesh.world, &world());

  ASSERT_EQ(mesh.ep_group->size(), ep);
  EXPECT_EQ(mesh.ep_group->rank(), mesh.ep_index);
  std::vector<int32_t> ep_members;
  for (int j = 0; j < ep; ++j) ep_members.push_back(mesh.ep_dp_index * ep + j);
  EXPECT_EQ(members(*mesh.ep_group), ep_members);

  ASSERT_EQ(mesh.expert_replicas->size(), 4 / ep);
  EXPECT_EQ(mesh.expert_replicas->rank(), mesh.ep_dp_index);
  std::vector<int32_t> replica_members;
  for (int j = 0; j < 4 / ep; ++j) replica_members.push_back(j * ep + mesh.ep_index);
  EXPECT_EQ(members(*mesh.expert_replicas), replica_members);
}

INSTANTIATE_TEST_SUITE_P(Ep, MeshLayout, ::testing::Values(1, 2, 4));

TEST(Mesh, ep_that_does_not_divide_the_world_names_valid_sizes) {
  expect_error([] { make_mesh(world(), 3, 8); },
               "parallel.ep = 3 does not divide the 4 ranks; use one of 1, 2, 4");
}

TEST(Mesh, ep_that_does_not_divide_the_experts_names_valid_sizes) {
  expect_error([] { make_mesh(world(), 4, 6); },
               "parallel.ep = 4 does not divide model.num_experts = 6");
  expect_error([] { make_mesh(world(), 4, 6); }, "use one of 1, 2");
}

TEST(Mesh, more_ep_ranks_than_experts_is_an_error) {
  expect_error([] { make_mesh(world(), 4, 2); }, "parallel.ep = 4 exceeds model.num_experts = 2");
  expect_error([] { make_mesh(world(), 4, 2); }, "use one of 1, 2");
}

TEST(Mesh, ep_below_one_is_an_error) {
  expect_error([] { make_mesh(world(), 0, 8); }, "parallel.ep = 0 must be at least 1");
}

// Under pipeline stages the EP mesh is per stage: the error counts the stage's ranks and says so.
TEST(Mesh, ep_that_does_not_divide_a_pipeline_stage_names_the_stage_ranks) {
  expect_error([] {
    PlanCommunicator job(0, 2);
    plan_mesh(job, 2, 8, 2);
  },
               "parallel.ep = 2 does not divide the 1 ranks of each pipeline stage (2 ranks / parallel.pp = 2");
}

TEST(Mesh, single_process_mesh_over_local_communicator) {
  LocalCommunicator local;
  Mesh mesh = make_mesh(local, 1, 8);
  EXPECT_EQ(mesh.ep_group->size(), 1);
  EXPECT_EQ(mesh.expert_replicas->size(), 1);
  expect_error([&] { make_mesh(local, 2, 8); },
               "parallel.ep = 2 does not divide the 1 ranks; use one of 1");
}

}  // namespace
}  // namespace moe

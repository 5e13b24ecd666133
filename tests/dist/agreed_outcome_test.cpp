// ranks: 2
// agree_on_outcome: the same error on every rank comes back as one AgreedError (printed once by
// the job), an error only one rank meets keeps its type there and stops the other rank naming it,
// and work that succeeds everywhere returns its value. No case may leave a rank waiting.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "moe/comm/agreed_outcome.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/core/error.h"

namespace moe {
namespace {

struct Outcome {
  bool agreed = false;  // threw AgreedError
  std::string what;     // "" when it returned
};

template <typename Work>
Outcome outcome_of(Communicator& world, Work&& work) {
  try {
    agree_on_outcome(world, work);
  } catch (const AgreedError& e) {
    return {true, e.what()};
  } catch (const Error& e) {
    return {false, e.what()};
  }
  return {};
}

TEST(AgreedOutcome, WorkThatSucceedsEverywhereReturnsItsValue) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const std::string v = agree_on_outcome(world, [&] { return "rank " + std::to_string(world.rank()); });
  EXPECT_EQ(v, "rank " + std::to_string(world.rank()));
  int calls = 0;
  agree_on_outcome(world, [&] { ++calls; });
  EXPECT_EQ(calls, 1);
}

TEST(AgreedOutcome, TheSameErrorOnEveryRankIsAgreed) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const Outcome o = outcome_of(world, [] { MOE_FAIL("data.path = \"/x\" does not exist"); });
  EXPECT_TRUE(o.agreed);
  EXPECT_NE(o.what.find("data.path = \"/x\" does not exist"), std::string::npos) << o.what;
  // Also for a work that returns a value.
  const Outcome v = outcome_of(world, []() -> int { MOE_FAIL("bad tokens"); });
  EXPECT_TRUE(v.agreed);
}

TEST(AgreedOutcome, AnErrorOnOneRankKeepsItsTypeThereAndStopsTheOtherNamingIt) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const Outcome o = outcome_of(world, [&] {
    if (world.rank() == 1) MOE_FAIL("cannot read /data/part-7.bin on this node");
    return 5;
  });
  EXPECT_FALSE(o.agreed);
  if (world.rank() == 1) {
    EXPECT_NE(o.what.find("cannot read /data/part-7.bin on this node"), std::string::npos) << o.what;
    EXPECT_EQ(o.what.find("stopped at start-up"), std::string::npos) << o.what;
  } else {
    EXPECT_NE(o.what.find("stopped at start-up: rank 1 failed: cannot read /data/part-7.bin"), std::string::npos)
        << o.what;
  }
  // Rank 0 alone: rank 1 names rank 0.
  const Outcome z = outcome_of(world, [&] {
    if (world.rank() == 0) MOE_FAIL("rank 0's own trouble");
  });
  EXPECT_FALSE(z.agreed);
  EXPECT_NE(z.what.find(world.rank() == 0 ? "rank 0's own trouble" : "stopped at start-up: rank 0 failed: rank 0's"),
            std::string::npos)
      << z.what;
}

TEST(AgreedOutcome, DifferentErrorsOnEachRankAreEachRanksOwn) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const Outcome o = outcome_of(world, [&] { MOE_FAIL("trouble on rank ", world.rank()); });
  EXPECT_FALSE(o.agreed);
  EXPECT_NE(o.what.find("trouble on rank " + std::to_string(world.rank())), std::string::npos) << o.what;
}

}  // namespace
}  // namespace moe

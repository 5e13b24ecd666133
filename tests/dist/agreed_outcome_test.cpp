// ranks: 2
// agree_on_outcome: the same error on every rank comes back as one AgreedError (printed once by
// the job), an error only one rank meets keeps its type there and stops the other rank naming it,
// and work that succeeds everywhere returns its value. No case may leave a rank waiting.
#include <gtest/gtest.h>
#include <mpi.h>

#include <new>
#include <stdexcept>
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

// An error whose message is empty is still an error (it was taken for success, and the value that
// was never made was returned).
TEST(AgreedOutcome, AnErrorWithAnEmptyMessageIsStillAnError) {
  MpiCommunicator world(MPI_COMM_WORLD);
  bool agreed = false;
  try {
    agree_on_outcome(world, []() -> std::string { throw std::runtime_error(""); });
  } catch (const AgreedError& e) {
    agreed = true;
    EXPECT_STREQ(e.what(), "");
  }
  EXPECT_TRUE(agreed);
  // On one rank only: that rank keeps its error, the other stops naming it.
  std::string what = "(returned)";
  try {
    agree_on_outcome(world, [&] {
      if (world.rank() == 1) throw std::runtime_error("");
      return 1;
    });
  } catch (const std::exception& e) {
    what = e.what();
  }
  EXPECT_EQ(what.find(world.rank() == 1 ? "" : "stopped at start-up: rank 1 failed: "), 0u) << what;
}

// Out of memory keeps its type on every rank: main prints its own message for it.
TEST(AgreedOutcome, OutOfMemoryIsNotTurnedIntoAnAgreedError) {
  MpiCommunicator world(MPI_COMM_WORLD);
  bool bad_alloc = false;
  try {
    agree_on_outcome(world, [] { throw std::bad_alloc(); });
  } catch (const AgreedError&) {
  } catch (const std::bad_alloc&) {
    bad_alloc = true;
  }
  EXPECT_TRUE(bad_alloc);
}

// leader_decides: rank 0's answer, or its error agreed on every rank.
TEST(AgreedOutcome, TheLeadersAnswerOrItsErrorReachesEveryRank) {
  MpiCommunicator world(MPI_COMM_WORLD);
  int calls = 0;
  EXPECT_EQ(leader_decides(world, [&] { return ++calls, std::string("step-000004"); }), "step-000004");
  EXPECT_EQ(calls, world.rank() == 0 ? 1 : 0);
  const Outcome o = outcome_of(world, [&] { leader_decides(world, []() -> std::string { MOE_FAIL("no run here"); }); });
  EXPECT_TRUE(o.agreed);
  EXPECT_NE(o.what.find("no run here"), std::string::npos) << o.what;
}

}  // namespace
}  // namespace moe

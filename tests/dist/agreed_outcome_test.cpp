// ranks: 2
// agree_on_outcome: the same error on every rank comes back as one AgreedError (printed once by
// the job); an error only some ranks meet becomes one AgreedError on every rank too, the lowest
// failing rank's, named; out of memory keeps its type; work that succeeds everywhere returns its
// value. No case may leave a rank waiting.
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

TEST(AgreedOutcome, AnErrorOnOneRankIsAgreedOnEveryRankNamingIt) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const Outcome o = outcome_of(world, [&] {
    if (world.rank() == 1) MOE_FAIL("cannot read /data/part-7.bin on this node");
    return 5;
  });
  EXPECT_TRUE(o.agreed);
  EXPECT_EQ(o.what.find("rank 1: cannot read /data/part-7.bin on this node"), 0u) << o.what;
  // Rank 0 alone: the same on every rank, naming rank 0.
  const Outcome z = outcome_of(world, [&] {
    if (world.rank() == 0) MOE_FAIL("rank 0's own trouble");
  });
  EXPECT_TRUE(z.agreed);
  EXPECT_EQ(z.what.find("rank 0: rank 0's own trouble"), 0u) << z.what;
}

// Different errors: the lowest failing rank's, on every rank (the next shows once it is fixed).
TEST(AgreedOutcome, DifferentErrorsOnEachRankAgreeOnTheLowestRanks) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const Outcome o = outcome_of(world, [&] { MOE_FAIL("trouble on rank ", world.rank()); });
  EXPECT_TRUE(o.agreed);
  EXPECT_EQ(o.what.find("rank 0: trouble on rank 0"), 0u) << o.what;
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
  // On one rank only: agreed on every rank, naming it.
  std::string what = "(returned)";
  try {
    agree_on_outcome(world, [&] {
      if (world.rank() == 1) throw std::runtime_error("");
      return 1;
    });
  } catch (const AgreedError& e) {
    what = e.what();
  }
  EXPECT_EQ(what, "rank 1: ");
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

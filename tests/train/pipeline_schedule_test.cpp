// The pipeline schedules as pure functions: every rank runs every (microbatch, chunk) forward and
// backward once, in an order that cannot deadlock (a simulated run finishes), with the in-flight
// counts 1F1B is known for, and a simulated bubble equal to the stated theoretical one.
#include "moe/parallel/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "moe/core/error.h"

namespace moe {
namespace {

std::vector<std::vector<PipelineOp>> all_ranks(PipelineSchedule s, const PipelineShape& shape) {
  std::vector<std::vector<PipelineOp>> ops;
  for (int r = 0; r < shape.stages; ++r) ops.push_back(schedule_ops(s, shape, r));
  return ops;
}

void expect_every_pass_once(const std::vector<std::vector<PipelineOp>>& ops, const PipelineShape& shape) {
  std::set<std::tuple<bool, int64_t, int>> seen;
  for (int r = 0; r < shape.stages; ++r)
    for (const PipelineOp& op : ops[r]) {
      EXPECT_EQ(shape.rank_of(op.chunk), r) << "chunk " << op.chunk << " runs on the wrong rank";
      EXPECT_TRUE(seen.insert({op.forward, op.microbatch, op.chunk}).second)
          << "pass (" << op.forward << ", " << op.microbatch << ", " << op.chunk << ") runs twice";
    }
  EXPECT_EQ(seen.size(), static_cast<size_t>(2 * shape.microbatches * shape.chunks()));
}

TEST(PipelineSchedule, OneFOneBRunsEveryPassOnceWithoutDeadlock) {
  for (int P : {1, 2, 3, 4})
    for (int64_t m : {1, 2, 3, 4, 8}) {
      const PipelineShape shape{P, 1, m};
      const auto ops = all_ranks(PipelineSchedule::OneFOneB, shape);
      expect_every_pass_once(ops, shape);
      EXPECT_NO_THROW(simulate_pipeline(ops, shape, 1.0, 2.0)) << "P " << P << " m " << m;
    }
}

TEST(PipelineSchedule, OneFOneBKeepsAtMostStagesMinusRankMicrobatchesInFlight) {
  const PipelineShape shape{4, 1, 8};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(in_flight(schedule_ops(PipelineSchedule::OneFOneB, shape, r), r), 4 - r);
  // Fewer microbatches than stages: never more in flight than there are microbatches.
  EXPECT_EQ(in_flight(schedule_ops(PipelineSchedule::OneFOneB, PipelineShape{4, 1, 2}, 0), 0), 2);
}

TEST(PipelineSchedule, OneFOneBFirstRankOrderIsWarmupThenAlternating) {
  const auto ops = schedule_ops(PipelineSchedule::OneFOneB, PipelineShape{2, 1, 3}, 0);
  const std::vector<PipelineOp> want{{true, 0, 0}, {true, 1, 0}, {false, 0, 0}, {true, 2, 0}, {false, 1, 0},
                                     {false, 2, 0}};
  EXPECT_EQ(ops, want);
}

TEST(PipelineSchedule, OneFOneBSimulatedBubbleEqualsTheory) {
  for (int P : {2, 4})
    for (int64_t m : {1, 4, 8}) {
      const PipelineShape shape{P, 1, m};
      const double sim = simulate_pipeline(all_ranks(PipelineSchedule::OneFOneB, shape), shape, 1.0, 2.0).bubble();
      EXPECT_NEAR(sim, theoretical_bubble(PipelineSchedule::OneFOneB, shape), 1e-12) << "P " << P << " m " << m;
      EXPECT_NEAR(theoretical_bubble(PipelineSchedule::OneFOneB, shape),
                  (P - 1.0) / (static_cast<double>(m) + P - 1.0), 1e-15);
    }
}

TEST(PipelineSchedule, InterleavedRunsEveryPassOnceWithoutDeadlock) {
  for (int P : {2, 4})
    for (int V : {1, 2, 3})
      for (int64_t groups : {1, 2, 3}) {
        const PipelineShape shape{P, V, groups * P};
        const auto ops = all_ranks(PipelineSchedule::Interleaved, shape);
        expect_every_pass_once(ops, shape);
        EXPECT_NO_THROW(simulate_pipeline(ops, shape, 1.0, 2.0)) << "P " << P << " V " << V << " m " << groups * P;
      }
}

TEST(PipelineSchedule, InterleavedShrinksTheBubbleByTheVirtualStages) {
  // With equal forward and backward times the simulated bubble is the theory's (P-1)/(V m + P-1).
  for (int V : {2, 4}) {
    const PipelineShape shape{2, V, 8};
    const auto ops = all_ranks(PipelineSchedule::Interleaved, shape);
    const double sim = simulate_pipeline(ops, shape, 1.0, 1.0).bubble();
    EXPECT_NEAR(theoretical_bubble(PipelineSchedule::Interleaved, shape), 1.0 / (V * 8.0 + 1.0), 1e-15);
    EXPECT_NEAR(sim, theoretical_bubble(PipelineSchedule::Interleaved, shape), 1e-12) << "V " << V;
    EXPECT_LT(sim, theoretical_bubble(PipelineSchedule::OneFOneB, PipelineShape{2, 1, 8}));
  }
}

TEST(PipelineSchedule, RefusesLayoutsItCannotRunNamingWhatWould) {
  try {
    schedule_ops(PipelineSchedule::Interleaved, PipelineShape{4, 2, 6}, 0);
    FAIL() << "6 microbatches over 4 stages interleaved must be refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("parallel.pp = 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("4, 8, 12"), std::string::npos) << msg;
  }
  EXPECT_THROW(schedule_ops(PipelineSchedule::OneFOneB, PipelineShape{2, 2, 4}, 0), Error);
}

// The overlapped gradient reduction under pp starts a bucket during the backward of the window's
// last microbatch, once its lowest block is done: that needs each chunk's backwards in microbatch
// order (the last one, m - 1, finishes the chunk's gradients) and a rank's chunks finishing from
// the highest down (so a block's last backward comes after every higher block's).
TEST(PipelineSchedule, EachChunksLastBackwardIsTheLastMicrobatchAndChunksFinishFromTheTop) {
  for (int P : {2, 3, 4})
    for (int V : {1, 2, 3})
      for (int64_t m : {int64_t{P}, int64_t{2 * P}, int64_t{4 * P}}) {
        const PipelineShape shape{P, V, m};
        const auto schedule = V == 1 ? PipelineSchedule::OneFOneB : PipelineSchedule::Interleaved;
        for (int r = 0; r < P; ++r) {
          std::map<int, int64_t> last_microbatch;  // chunk -> microbatch of its latest backward so far
          std::vector<int> finish_order;
          for (const PipelineOp& op : schedule_ops(schedule, shape, r)) {
            if (op.forward) continue;
            auto it = last_microbatch.find(op.chunk);
            if (it != last_microbatch.end()) {
              EXPECT_GT(op.microbatch, it->second) << "P " << P << " V " << V;
            }
            last_microbatch[op.chunk] = op.microbatch;
            if (op.microbatch == m - 1) finish_order.push_back(op.chunk);
          }
          ASSERT_EQ(finish_order.size(), static_cast<size_t>(V));
          EXPECT_TRUE(std::is_sorted(finish_order.rbegin(), finish_order.rend())) << "P " << P << " V " << V << " m " << m;
        }
      }
}

TEST(PipelineSchedule, SimulationDetectsADeadlockedOrder) {
  // Rank 0 runs the backward of microbatch 0 before sending its forward: never satisfiable.
  const PipelineShape shape{2, 1, 1};
  std::vector<std::vector<PipelineOp>> ops{{{false, 0, 0}, {true, 0, 0}}, {{true, 0, 1}, {false, 0, 1}}};
  EXPECT_THROW(simulate_pipeline(ops, shape, 1.0, 1.0), Error);
}

}  // namespace
}  // namespace moe

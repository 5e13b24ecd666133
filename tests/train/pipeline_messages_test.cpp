// The pipeline's message plan: every pass's input is received before it and its output sent after
// it, in groups that a transport whose sends wait for their receivers and that matches messages
// by order, not tag (NCCL), delivers without deadlock and to the right pass, for every schedule
// and shape the trainer accepts; and the check finds orders that would deadlock or mismatch.
#include "moe/parallel/pipeline_messages.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace moe {
namespace {

using Groups = std::vector<std::vector<std::vector<PipelineMessage>>>;

Groups plan(PipelineSchedule s, const PipelineShape& shape, bool rendezvous = true) {
  Groups g;
  for (int r = 0; r < shape.stages; ++r)
    g.push_back(pipeline_message_groups(s, schedule_ops(s, shape, r), shape, r, rendezvous));
  return g;
}

TEST(PipelineMessages, EveryBoundaryCrossingIsSentOnceAndReceivedOnceAroundItsPasses) {
  const PipelineShape shape{3, 2, 6};
  for (bool rendezvous : {false, true}) {
    const Groups g = plan(PipelineSchedule::Interleaved, shape, rendezvous);
    std::map<std::pair<int, int>, std::set<int>> sent, received;  // (from, to) -> tags
    for (int r = 0; r < shape.stages; ++r) {
      const auto ops = schedule_ops(PipelineSchedule::Interleaved, shape, r);
      ASSERT_EQ(g[r].size(), ops.size() + 1);
      for (size_t j = 0; j < g[r].size(); ++j)
        for (const PipelineMessage& m : g[r][j]) {
          // A receive comes before its pass, a send after it: at once without rendezvous, at most
          // one pass away with it (the steady-state pairs).
          if (m.send)
            EXPECT_TRUE(j == m.op + 1 || (rendezvous && j == m.op + 2)) << "rank " << r << " group " << j;
          else
            EXPECT_TRUE(j == m.op || (rendezvous && j + 1 == m.op)) << "rank " << r << " group " << j;
          EXPECT_TRUE((m.send ? sent[{r, m.peer}] : received[{m.peer, r}]).insert(m.tag).second) << "tag " << m.tag;
        }
    }
    EXPECT_EQ(sent, received);
    size_t messages = 0;
    for (const auto& [pair, tags] : sent) messages += tags.size();
    // Each of the C - 1 boundaries is crossed by every microbatch once forward and once backward.
    EXPECT_EQ(messages, static_cast<size_t>(2 * (shape.chunks() - 1) * shape.microbatches));
  }
}

TEST(PipelineMessages, OneFOneBExchangesAroundEveryPassWithOrWithoutRendezvous) {
  const PipelineShape shape{4, 1, 8};
  const Groups buffered = plan(PipelineSchedule::OneFOneB, shape, false), paired = plan(PipelineSchedule::OneFOneB, shape);
  for (int r = 0; r < shape.stages; ++r)
    for (size_t j = 0; j < buffered[r].size(); ++j) {
      ASSERT_EQ(buffered[r][j].size(), paired[r][j].size());
      for (size_t k = 0; k < buffered[r][j].size(); ++k) EXPECT_EQ(buffered[r][j][k].tag, paired[r][j][k].tag);
    }
}

TEST(PipelineMessages, EveryAcceptedScheduleDeliversWithRendezvousAndNoTags) {
  for (int P = 2; P <= 8; ++P)
    for (int64_t m = 1; m <= 16; ++m) {
      const PipelineShape one{P, 1, m};
      EXPECT_EQ(message_order_problem(plan(PipelineSchedule::OneFOneB, one)), "") << "1f1b P " << P << " m " << m;
      for (int V : {2, 3, 4}) {
        const PipelineShape shape{P, V, m};
        if (!schedule_problem(PipelineSchedule::Interleaved, shape).empty()) continue;
        EXPECT_EQ(message_order_problem(plan(PipelineSchedule::Interleaved, shape)), "")
            << "interleaved P " << P << " V " << V << " m " << m;
      }
    }
  // The per-pass order (what MPI's buffered sends run) would deadlock an interleaved schedule with
  // more microbatches than stages if sends waited: the reason for the steady-state pairs.
  EXPECT_NE(message_order_problem(plan(PipelineSchedule::Interleaved, {2, 2, 4}, false)), "");
}

// Evaluation's forward-only passes (microbatch after microbatch, each rank's chunks in model
// order), in per-pass groups.
TEST(PipelineMessages, ForwardOnlyPassesDeliverWithRendezvousAndNoTags) {
  for (int P : {2, 3, 4, 8})
    for (int V : {1, 2, 3})
      for (int64_t m : {1, 2, 3, 5}) {
        const PipelineShape shape{P, V, m};
        Groups g;
        size_t messages = 0;
        for (int r = 0; r < P; ++r) {
          const auto ops = forward_only_ops(shape, r);
          ASSERT_EQ(ops.size(), static_cast<size_t>(V * m));
          g.push_back(pipeline_message_groups(PipelineSchedule::OneFOneB, ops, shape, r, false));
          for (const auto& group : g.back()) messages += group.size();
        }
        EXPECT_EQ(messages, static_cast<size_t>(2 * (shape.chunks() - 1) * m));  // each sent and received once
        EXPECT_EQ(message_order_problem(g), "") << "P " << P << " V " << V << " m " << m;
      }
}

TEST(PipelineMessages, FindsGroupsThatDeadlockWhenSendsWaitForReceivers) {
  // Both ranks send before they receive, each in its own group: each send waits for a receive the
  // other rank only posts after its own send has completed.
  const Groups g = {{{{true, 1, 7, 0}}, {{false, 1, 8, 1}}}, {{{true, 0, 8, 0}}, {{false, 0, 7, 1}}}};
  EXPECT_NE(message_order_problem(g).find("deadlock"), std::string::npos) << message_order_problem(g);
  // The same messages, each rank's send and receive in one group: delivered.
  const Groups paired = {{{{true, 1, 7, 0}, {false, 1, 8, 0}}}, {{{true, 0, 8, 0}, {false, 0, 7, 0}}}};
  EXPECT_EQ(message_order_problem(paired), "");
}

TEST(PipelineMessages, FindsMessagesAnOrderOnlyTransportWouldDeliverToTheWrongPass) {
  // Rank 0 sends tags 1 then 2; rank 1 receives 2 then 1 (MPI's tags would sort them out; NCCL's
  // order would hand tag 1's data to the receive of tag 2).
  const Groups g = {{{{true, 1, 1, 0}, {true, 1, 2, 0}}}, {{{false, 0, 2, 0}, {false, 0, 1, 0}}}};
  const std::string problem = message_order_problem(g);
  EXPECT_NE(problem.find("sent as tag 1 but received as tag 2"), std::string::npos) << problem;
}

}  // namespace
}  // namespace moe

#include "moe/parallel/pipeline_messages.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <utility>

namespace moe {

int pipeline_message_tag(int64_t microbatch, int boundary, bool forward, int chunks) {
  return static_cast<int>(((microbatch * chunks + boundary) * 2 + (forward ? 0 : 1)) % 32768);
}

std::vector<std::vector<PipelineMessage>> pipeline_message_groups(PipelineSchedule schedule,
                                                                  const std::vector<PipelineOp>& ops,
                                                                  const PipelineShape& shape, int rank,
                                                                  bool rendezvous) {
  const int P = shape.stages, C = shape.chunks();
  // Per pass: its input (a receive) and its output (a send), where it has them.
  std::vector<std::vector<PipelineMessage>> input(ops.size()), output(ops.size());
  for (size_t j = 0; j < ops.size(); ++j) {
    const PipelineOp& op = ops[j];
    const int c = op.chunk;
    const int64_t i = op.microbatch;
    if (op.forward && c > 0) input[j].push_back({false, (c - 1) % P, pipeline_message_tag(i, c - 1, true, C), j});
    if (!op.forward && c < C - 1) input[j].push_back({false, (c + 1) % P, pipeline_message_tag(i, c, false, C), j});
    if (op.forward && c < C - 1) output[j].push_back({true, (c + 1) % P, pipeline_message_tag(i, c, true, C), j});
    if (!op.forward && c > 0) output[j].push_back({true, (c - 1) % P, pipeline_message_tag(i, c - 1, false, C), j});
  }
  // Units of passes that exchange together: single passes, or steady-state (forward, backward)
  // pairs of an interleaved schedule over a rendezvous transport.
  const auto n = static_cast<int64_t>(ops.size());
  const int64_t warmup = warmup_passes(schedule, shape, rank);
  const int64_t pairs_end = schedule == PipelineSchedule::Interleaved && rendezvous ? warmup + 2 * (n / 2 - warmup) : 0;
  std::vector<std::vector<PipelineMessage>> groups(ops.size() + 1);
  for (int64_t j = 0; j < n;) {
    const int64_t len = j >= warmup && j < pairs_end ? 2 : 1;
    auto& before = groups[static_cast<size_t>(j)];
    auto& after = groups[static_cast<size_t>(j + len)];
    for (int64_t q = j; q < j + len; ++q) {
      before.insert(before.end(), input[static_cast<size_t>(q)].begin(), input[static_cast<size_t>(q)].end());
      after.insert(after.end(), output[static_cast<size_t>(q)].begin(), output[static_cast<size_t>(q)].end());
    }
    j += len;
  }
  // Sends first in each group: the previous unit's outputs go out with this unit's inputs.
  for (auto& g : groups)
    std::stable_partition(g.begin(), g.end(), [](const PipelineMessage& m) { return m.send; });
  return groups;
}

std::string message_order_problem(const std::vector<std::vector<std::vector<PipelineMessage>>>& groups) {
  const int P = static_cast<int>(groups.size());
  struct Posted {
    int tag, rank;
    size_t group;
  };
  // (from, to) -> sends posted by `from`, receives posted by `to`, in posting order.
  std::map<std::pair<int, int>, std::vector<Posted>> sends, recvs;
  std::map<std::pair<int, int>, size_t> matched;
  std::vector<size_t> current(static_cast<size_t>(P), 0);
  std::vector<std::vector<size_t>> open(static_cast<size_t>(P));  // unmatched messages per group
  auto post = [&](int r) {
    const size_t g = current[static_cast<size_t>(r)];
    for (const PipelineMessage& m : groups[static_cast<size_t>(r)][g]) {
      if (m.send)
        sends[{r, m.peer}].push_back({m.tag, r, g});
      else
        recvs[{m.peer, r}].push_back({m.tag, r, g});
    }
  };
  for (int r = 0; r < P; ++r) {
    for (const auto& g : groups[static_cast<size_t>(r)]) open[static_cast<size_t>(r)].push_back(g.size());
    if (!groups[static_cast<size_t>(r)].empty()) post(r);
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (auto& [pair, posted] : sends) {
      const std::vector<Posted>& want = recvs[pair];
      size_t& k = matched[pair];
      for (; k < posted.size() && k < want.size(); ++k) {
        if (posted[k].tag != want[k].tag) {
          std::ostringstream os;
          os << "message " << k + 1 << " from pipeline rank " << pair.first << " to rank " << pair.second
             << " is sent as tag " << posted[k].tag << " but received as tag " << want[k].tag
             << " (a transport without tags would deliver it to the wrong pass)";
          return os.str();
        }
        --open[static_cast<size_t>(pair.first)][posted[k].group];
        --open[static_cast<size_t>(pair.second)][want[k].group];
        progress = true;
      }
    }
    for (int r = 0; r < P; ++r) {
      size_t& g = current[static_cast<size_t>(r)];
      while (g + 1 < groups[static_cast<size_t>(r)].size() && open[static_cast<size_t>(r)][g] == 0) {
        ++g;
        post(r);
        progress = true;
      }
    }
  }
  std::ostringstream blocked;
  int count = 0;
  for (int r = 0; r < P; ++r) {
    const size_t g = current[static_cast<size_t>(r)];
    if (!groups[static_cast<size_t>(r)].empty() && open[static_cast<size_t>(r)][g] != 0)
      blocked << (count++ ? ", " : "") << "rank " << r << " at message group " << g;
  }
  if (count == 0) return "";
  return "the pipeline's messages deadlock when sends wait for their receivers: " + blocked.str();
}

}  // namespace moe

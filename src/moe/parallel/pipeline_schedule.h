// Pipeline schedules as pure functions: for each rank of a pipeline of P stages, the ordered list
// of forward and backward passes it runs in one optimizer step of m microbatches. The executor
// (train/pipeline_executor.h) follows the list; the in-flight counts size the activation sets and
// the expert-buffer lease pools at start-up.
//
// Model chunks: with V virtual stages per rank the layers form C = P x V contiguous chunks; chunk c
// runs on rank c % P as its virtual stage c / P (V = 1: chunk = rank). Microbatch i flows forward
// through chunks 0..C-1 and backward through C-1..0.
//   1f1b:        rank r runs min(P - 1 - r, m) forwards (warm-up), then alternates one forward and
//                one backward, then the remaining backwards (PipeDream-Flush / Megatron 1F1B).
//   interleaved: the same pattern over the m x V (microbatch, chunk) passes of a rank, taken in
//                groups of P microbatches per chunk (Megatron's interleaved 1F1B); m must be a
//                multiple of P.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe {

enum class PipelineSchedule { OneFOneB, Interleaved };

struct PipelineOp {
  bool forward = true;
  int64_t microbatch = 0;
  int chunk = 0;  // the model chunk (global index, 0..C-1)
  bool operator==(const PipelineOp& o) const {
    return forward == o.forward && microbatch == o.microbatch && chunk == o.chunk;
  }
};

struct PipelineShape {
  int stages = 1;           // P
  int virtual_stages = 1;   // V
  int64_t microbatches = 1; // m
  int chunks() const { return stages * virtual_stages; }
  int rank_of(int chunk) const { return chunk % stages; }
};

// "" when `schedule` can run `shape`, else why not (naming the keys and the values that would work).
std::string schedule_problem(PipelineSchedule schedule, const PipelineShape& shape);
// The ops rank `rank` runs, in order. Throws with schedule_problem's message.
std::vector<PipelineOp> schedule_ops(PipelineSchedule schedule, const PipelineShape& shape, int rank);
// Forward passes only (evaluation), microbatch after microbatch, each through rank `rank`'s chunks
// in model order.
std::vector<PipelineOp> forward_only_ops(const PipelineShape& shape, int rank);
// The forward passes rank `rank` runs before its first backward (the warm-up); the passes after
// them alternate one forward and one backward (the steady state) until the forwards run out.
int64_t warmup_passes(PipelineSchedule schedule, const PipelineShape& shape, int rank);
// Most microbatches whose forward through `chunk` has run and whose backward has not, at once,
// on the chunk's rank: the activation sets and lease slots the chunk needs.
int in_flight(const std::vector<PipelineOp>& ops, int chunk);
// The schedule's bubble: idle time over total time per rank, with equal forward and backward
// times per chunk: 1f1b (P - 1) / (m + P - 1); interleaved (P - 1) / (V m + P - 1).
double theoretical_bubble(PipelineSchedule schedule, const PipelineShape& shape);

// Executes every rank's op list with a forward of `forward_time` and a backward of `backward_time`
// per chunk, where an op waits for its input (the previous chunk's forward, the next chunk's
// backward): the makespan and each rank's busy time. Throws naming the blocked ranks when the lists
// deadlock. The schedule tests check ordering and bubbles with it.
struct SimulatedPipeline {
  double makespan = 0;
  std::vector<double> busy;  // per rank
  double bubble() const;     // mean over ranks of 1 - busy / makespan
};
SimulatedPipeline simulate_pipeline(const std::vector<std::vector<PipelineOp>>& ops, const PipelineShape& shape,
                                    double forward_time, double backward_time);

}  // namespace moe

#include "moe/parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "moe/core/error.h"

namespace moe {
namespace {

// "2, 4, 6": the microbatch counts up to `limit` that are multiples of `step`.
std::string multiples(int64_t step, int64_t limit) {
  std::ostringstream os;
  for (int64_t k = step; k <= std::max(limit, step * 3); k += step) os << (k == step ? "" : ", ") << k;
  return os.str();
}

std::vector<PipelineOp> one_f_one_b(const PipelineShape& s, int rank) {
  const int64_t m = s.microbatches;
  const int64_t warmup = warmup_passes(PipelineSchedule::OneFOneB, s, rank);
  std::vector<PipelineOp> ops;
  for (int64_t i = 0; i < warmup; ++i) ops.push_back({true, i, rank});
  for (int64_t i = 0; i < m - warmup; ++i) {
    ops.push_back({true, warmup + i, rank});
    ops.push_back({false, i, rank});
  }
  for (int64_t i = m - warmup; i < m; ++i) ops.push_back({false, i, rank});
  return ops;
}

// The k-th forward (or backward) pass of `rank` in the interleaved order: microbatches go in
// groups of P, each group through the rank's chunks in order (backward: in reverse order).
PipelineOp interleaved_pass(const PipelineShape& s, int rank, int64_t k, bool forward) {
  const int64_t P = s.stages, group = P * s.virtual_stages, in_group = k % group;
  int v = static_cast<int>(in_group / P);
  if (!forward) v = s.virtual_stages - 1 - v;
  return {forward, (k / group) * P + k % P, v * s.stages + rank};
}

std::vector<PipelineOp> interleaved(const PipelineShape& s, int rank) {
  const int64_t total = s.microbatches * s.virtual_stages;
  const int64_t warmup = warmup_passes(PipelineSchedule::Interleaved, s, rank);
  std::vector<PipelineOp> ops;
  for (int64_t k = 0; k < warmup; ++k) ops.push_back(interleaved_pass(s, rank, k, true));
  for (int64_t k = 0; k < total - warmup; ++k) {
    ops.push_back(interleaved_pass(s, rank, warmup + k, true));
    ops.push_back(interleaved_pass(s, rank, k, false));
  }
  for (int64_t k = total - warmup; k < total; ++k) ops.push_back(interleaved_pass(s, rank, k, false));
  return ops;
}

}  // namespace

int64_t warmup_passes(PipelineSchedule schedule, const PipelineShape& s, int rank) {
  if (schedule == PipelineSchedule::OneFOneB) return std::min<int64_t>(s.stages - 1 - rank, s.microbatches);
  const int64_t total = s.microbatches * s.virtual_stages;
  // With m = P every forward runs first (Megatron's rule): there is no steady state to fill.
  if (s.microbatches == s.stages) return total;
  return std::min(int64_t{2} * (s.stages - 1 - rank) + int64_t{s.virtual_stages - 1} * s.stages, total);
}

std::string schedule_problem(PipelineSchedule schedule, const PipelineShape& s) {
  std::ostringstream os;
  if (s.stages < 1 || s.microbatches < 1 || s.virtual_stages < 1) {
    os << "a pipeline needs at least one stage, virtual stage and microbatch (parallel.pp = " << s.stages
       << ", parallel.pp_virtual = " << s.virtual_stages << ", " << s.microbatches << " microbatches)";
  } else if (schedule == PipelineSchedule::OneFOneB && s.virtual_stages != 1) {
    os << "parallel.pp_schedule = \"1f1b\" runs one stage per rank, but parallel.pp_virtual = " << s.virtual_stages
       << "; use parallel.pp_virtual = 1 or parallel.pp_schedule = \"interleaved\"";
  } else if (schedule == PipelineSchedule::Interleaved && s.microbatches % s.stages != 0) {
    os << "parallel.pp_schedule = \"interleaved\" takes microbatches in groups of parallel.pp = " << s.stages
       << ", but each rank runs " << s.microbatches << " per step (train.global_batch_size / (train.micro_batch_size"
       << " x data-parallel ranks)); use a global batch that gives " << multiples(s.stages, s.microbatches)
       << " microbatches, or parallel.pp_schedule = \"1f1b\"";
  }
  return os.str();
}

std::vector<PipelineOp> schedule_ops(PipelineSchedule schedule, const PipelineShape& shape, int rank) {
  const std::string problem = schedule_problem(schedule, shape);
  MOE_CHECK(problem.empty(), problem);
  MOE_CHECK(rank >= 0 && rank < shape.stages, "schedule_ops: rank ", rank, " outside the ", shape.stages, " stages");
  return schedule == PipelineSchedule::OneFOneB ? one_f_one_b(shape, rank) : interleaved(shape, rank);
}

std::vector<PipelineOp> forward_only_ops(const PipelineShape& shape, int rank) {
  std::vector<PipelineOp> ops;
  for (int64_t i = 0; i < shape.microbatches; ++i)
    for (int c = rank; c < shape.chunks(); c += shape.stages) ops.push_back({true, i, c});
  return ops;
}

int in_flight(const std::vector<PipelineOp>& ops, int chunk) {
  int alive = 0, most = 0;
  for (const PipelineOp& op : ops) {
    if (op.chunk != chunk) continue;
    alive += op.forward ? 1 : -1;
    most = std::max(most, alive);
  }
  return most;
}

double theoretical_bubble(PipelineSchedule schedule, const PipelineShape& s) {
  const double idle = s.stages - 1;
  const double work = static_cast<double>(s.microbatches) * (schedule == PipelineSchedule::Interleaved ? s.virtual_stages : 1);
  return idle / (work + idle);
}

double SimulatedPipeline::bubble() const {
  if (busy.empty() || makespan <= 0) return 0;
  double sum = 0;
  for (double b : busy) sum += 1.0 - b / makespan;
  return sum / static_cast<double>(busy.size());
}

SimulatedPipeline simulate_pipeline(const std::vector<std::vector<PipelineOp>>& ops, const PipelineShape& shape,
                                    double forward_time, double backward_time) {
  const int P = static_cast<int>(ops.size()), C = shape.chunks();
  // Finish time of each (forward?, microbatch, chunk) pass that has run.
  std::map<std::tuple<bool, int64_t, int>, double> done;
  std::vector<size_t> next(P, 0);
  std::vector<double> free_at(P, 0.0);
  SimulatedPipeline out;
  out.busy.assign(P, 0.0);
  const double per_chunk_f = forward_time / shape.virtual_stages, per_chunk_b = backward_time / shape.virtual_stages;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      while (next[r] < ops[r].size()) {
        const PipelineOp& op = ops[r][next[r]];
        // The pass this one waits for: forward needs the previous chunk's forward, backward the next
        // chunk's backward (the last chunk's backward its own forward, the loss).
        std::tuple<bool, int64_t, int> input;
        bool has_input = true;
        if (op.forward) {
          has_input = op.chunk > 0;
          input = {true, op.microbatch, op.chunk - 1};
        } else {
          input = op.chunk == C - 1 ? std::make_tuple(true, op.microbatch, op.chunk)
                                    : std::make_tuple(false, op.microbatch, op.chunk + 1);
        }
        double ready = free_at[r];
        if (has_input) {
          auto it = done.find(input);
          if (it == done.end()) break;  // blocked on a receive
          ready = std::max(ready, it->second);
        }
        const double t = op.forward ? per_chunk_f : per_chunk_b;
        free_at[r] = ready + t;
        out.busy[r] += t;
        done[{op.forward, op.microbatch, op.chunk}] = free_at[r];
        ++next[r];
        progress = true;
      }
    }
  }
  std::string blocked;
  for (int r = 0; r < P; ++r) {
    if (next[r] < ops[r].size()) blocked += (blocked.empty() ? "" : ", ") + std::to_string(r);
    out.makespan = std::max(out.makespan, free_at[r]);
  }
  MOE_CHECK(blocked.empty(), "the pipeline schedule deadlocks: ranks ", blocked, " wait for passes never run");
  return out;
}

}  // namespace moe

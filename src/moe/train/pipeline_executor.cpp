#include "moe/train/pipeline_executor.h"

#include <vector>

#include "moe/core/wall_clock.h"

namespace moe {
namespace {

// Which activation set each (chunk, microbatch) uses, and which sets' sent buffers may still be
// read by a queued send.
class SetTracker {
 public:
  SetTracker(int chunks, int sets) : sets_(sets), owner_(chunks, std::vector<int64_t>(sets, -1)) {}
  int set_of(int64_t microbatch) const { return static_cast<int>(microbatch % sets_); }
  void begin(int chunk, int64_t microbatch) {
    int64_t& o = owner_[chunk][set_of(microbatch)];
    MOE_CHECK(o < 0, "pipeline: chunk ", chunk, " starts microbatch ", microbatch, " in activation set ",
              set_of(microbatch), ", still held by microbatch ", o, " (the schedule keeps more in flight than planned)");
    o = microbatch;
  }
  void end(int chunk, int64_t microbatch) { owner_[chunk][set_of(microbatch)] = -1; }

 private:
  int sets_;
  std::vector<std::vector<int64_t>> owner_;
};

// The tag of the message across the boundary after chunk `boundary` for microbatch i (activation
// forward, gradient backward): a rank receives each from the right pass whatever order its
// neighbour sent them in (interleaved ranks exchange several chunks' messages both ways).
int message_tag(int64_t microbatch, int boundary, bool forward, int chunks) {
  return static_cast<int>(((microbatch * chunks + boundary) * 2 + (forward ? 0 : 1)) % 32768);
}

}  // namespace

PipelineStepTimes run_pipeline_step(const PipelinePlan& plan, Communicator& pipeline, Transformer& model,
                                    ParamStore& store, const PipelineStepInput& in) {
  const int P = plan.shape.stages, C = plan.layout.chunks();
  const auto t_start = SteadyClock::now();
  PipelineStepTimes times;
  SetTracker sets(model.chunks(), plan.activation_sets);
  const ModelWeights& w = store.weights();
  const ModelWeights& g = store.grads();
  for (const PipelineOp& op : plan.ops) {
    const int k = plan.model_chunk(op.chunk), set = sets.set_of(op.microbatch);
    const int64_t i = op.microbatch, R = in.rows;
    const Tensor tokens = in.tokens.rows(i * R, (i + 1) * R), targets = in.targets.rows(i * R, (i + 1) * R);
    if (op.forward) {
      sets.begin(k, i);
      if (op.chunk > 0)
        pipeline.recv(model.chunk_input(k, set), (op.chunk - 1) % P, message_tag(i, op.chunk - 1, true, C));
      const auto t0 = SteadyClock::now();
      model.chunk_forward(k, set, w, tokens, in.routing_seed(i), in.routing);
      times.compute_s += seconds_since(t0);
      if (op.chunk < C - 1)
        pipeline.send(model.chunk_output(k, set), (op.chunk + 1) % P, message_tag(i, op.chunk, true, C));
    } else {
      if (op.chunk < C - 1) pipeline.recv(model.output_grad(), (op.chunk + 1) % P, message_tag(i, op.chunk, false, C));
      const auto t0 = SteadyClock::now();
      model.chunk_backward(k, set, w, g, tokens, targets, in.scales);
      model.add_chunk_stats(in.stats, k, set);
      times.compute_s += seconds_since(t0);
      if (op.chunk > 0)
        pipeline.send(model.input_grad(k, set), (op.chunk - 1) % P, message_tag(i, op.chunk - 1, false, C));
      sets.end(k, i);
    }
  }
  pipeline.wait_sends();  // every message of the step has been received: nothing crosses into the next one
  times.wall_s = seconds_since(t_start);
  return times;
}

void run_pipeline_forward(const PipelinePlan& plan, Communicator& pipeline, Transformer& model, ParamStore& store,
                          const PipelineStepInput& in, int64_t microbatches) {
  const int P = plan.shape.stages, C = plan.layout.chunks();
  const ModelWeights& w = store.weights();
  for (int64_t i = 0; i < microbatches; ++i) {
    const int64_t R = in.rows;
    const Tensor tokens = in.tokens.rows(i * R, (i + 1) * R), targets = in.targets.rows(i * R, (i + 1) * R);
    // Chunks in model order: on this rank, each waits for the previous rank's output of microbatch i.
    for (int c = 0; c < C; ++c) {
      if (plan.layout.rank_of(c) != plan.layout.rank_of(plan.chunks[0])) continue;
      const int k = plan.model_chunk(c);
      if (c > 0) pipeline.recv(model.chunk_input(k, 0), (c - 1) % P, message_tag(i, c - 1, true, C));
      model.chunk_forward_loss(k, 0, w, tokens, targets, in.routing_seed(i), in.routing);
      if (model.has_head(k)) model.add_chunk_stats(in.stats, k, 0);
      if (c < C - 1) pipeline.send(model.chunk_output(k, 0), (c + 1) % P, message_tag(i, c, true, C));
    }
  }
  pipeline.wait_sends();
}

}  // namespace moe

#include "moe/train/pipeline_executor.h"

#include <vector>

#include "moe/parallel/pipeline_messages.h"

namespace moe {
namespace {

// Which activation set each (chunk, microbatch) uses, and that no set is started while another
// microbatch still holds it.
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

// The buffer a message of pass list `ops` reads (send) or fills (receive): a forward's input or
// output activation, a backward's output-gradient input (the shared residual-gradient scratch) or
// its input gradient.
Tensor message_buffer(const PipelinePlan& plan, const std::vector<PipelineOp>& ops, Transformer& model,
                      const SetTracker& sets, const PipelineMessage& m) {
  const PipelineOp& op = ops[m.op];
  const int k = plan.model_chunk(op.chunk), set = sets.set_of(op.microbatch);
  if (op.forward) return m.send ? model.chunk_output(k, set) : model.chunk_input(k, set);
  return m.send ? model.input_grad(k, set) : model.output_grad();
}

void issue(const std::vector<PipelineMessage>& group, const PipelinePlan& plan, const std::vector<PipelineOp>& ops,
           Communicator& pipeline, Transformer& model, const SetTracker& sets) {
  if (group.empty()) return;
  pipeline.begin_group();
  for (const PipelineMessage& m : group) {
    const Tensor buf = message_buffer(plan, ops, model, sets, m);
    if (m.send)
      pipeline.send(buf, m.peer, m.tag);
    else
      pipeline.recv(buf, m.peer, m.tag);
  }
  pipeline.end_group();
}

}  // namespace

void run_pipeline_step(const PipelinePlan& plan, Communicator& pipeline, Transformer& model, ParamStore& store,
                       const PipelineStepInput& in, PassTimer& timer) {
  MOE_CHECK(plan.messages.size() == plan.ops.size() + 1, "pipeline: ", plan.messages.size(),
            " message groups for ", plan.ops.size(), " passes");
  timer.start();
  SetTracker sets(model.chunks(), plan.activation_sets);
  const ModelWeights& w = store.weights();
  const ModelWeights& g = store.grads();
  for (size_t j = 0; j < plan.ops.size(); ++j) {
    const PipelineOp& op = plan.ops[j];
    const int k = plan.model_chunk(op.chunk), set = sets.set_of(op.microbatch);
    const int64_t i = op.microbatch, R = in.rows;
    const Tensor tokens = in.tokens.rows(i * R, (i + 1) * R), targets = in.targets.rows(i * R, (i + 1) * R);
    issue(plan.messages[j], plan, plan.ops, pipeline, model, sets);
    // The window's last microbatch ends each chunk's backward passes (every schedule runs a
    // chunk's backwards in microbatch order), and the rank's chunks finish from the highest down,
    // so the blocks complete in the order the store's overlapped reduction plans for.
    store.begin_microbatch(!op.forward && i == plan.shape.microbatches - 1);
    timer.begin_pass();
    if (op.forward) {
      sets.begin(k, i);
      model.chunk_forward(k, set, w, tokens, in.routing_seed(i), in.routing);
    } else {
      model.chunk_backward(k, set, w, g, tokens, targets, in.scales);
      model.add_chunk_stats(in.stats, k, set);
      sets.end(k, i);
    }
    timer.end_pass();
  }
  issue(plan.messages.back(), plan, plan.ops, pipeline, model, sets);
  pipeline.wait_sends();  // every message of the step has been received: nothing crosses into the next one
  timer.stop();
}

void run_pipeline_forward(const PipelinePlan& plan, Communicator& pipeline, Transformer& model, ParamStore& store,
                          const PipelineStepInput& in) {
  // One microbatch through this rank's chunks, in activation set 0; the messages in per-pass
  // groups (pipeline_messages_test checks that they deliver without tags or buffering).
  const std::vector<PipelineOp>& ops = plan.eval_ops;
  const auto& groups = plan.eval_messages;
  const SetTracker sets(model.chunks(), 1);
  const ModelWeights& w = store.weights();
  for (size_t j = 0; j < ops.size(); ++j) {
    const int k = plan.model_chunk(ops[j].chunk);
    issue(groups[j], plan, ops, pipeline, model, sets);
    model.chunk_forward_loss(k, 0, w, in.tokens, in.targets, in.routing_seed(0), in.routing);
    if (model.has_head(k)) model.add_chunk_stats(in.stats, k, 0);
  }
  issue(groups.back(), plan, ops, pipeline, model, sets);
  pipeline.wait_sends();
}

}  // namespace moe

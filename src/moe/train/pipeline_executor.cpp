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

// Queues the message groups on the transport. On the GPU they go on a stream of their own: it
// waits for the passes before each group (a send's data is written, a receive's buffer no longer
// read), and the compute stream waits for a group only where the next pass reads what it receives,
// or before a pass of a chunk and activation set rewrites a buffer that a group still sends. A
// group of sends alone therefore runs beside the next passes. Every wait is one that queueing the
// messages on the compute stream implied (everything before a group, and the group before
// everything after it), so the order stays deadlock-free. On the CPU (MPI) the sends are copies
// and the receives wait on the host: nothing to order.
class MessageIssuer {
 public:
  MessageIssuer(const PipelinePlan& plan, const std::vector<PipelineOp>& ops, Communicator& pipeline,
                Transformer& model, const SetTracker& sets, SideStream& stream)
      : plan_(plan), ops_(ops), pipeline_(pipeline), model_(model), sets_(sets), stream_(stream),
        sending_(model.chunks()) {
    stream_.forget_marks();
  }

  void issue(const std::vector<PipelineMessage>& group) {
    if (group.empty()) return;
    stream_.follow_compute();
    bool receives = false;
    pipeline_.begin_group();
    for (const PipelineMessage& m : group) {
      const Tensor buf = message_buffer(plan_, ops_, model_, sets_, m);
      if (m.send)
        pipeline_.send(buf, m.peer, m.tag, stream_.stream());
      else
        pipeline_.recv(buf, m.peer, m.tag, stream_.stream());
      receives = receives || !m.send;
    }
    pipeline_.end_group();
    const int mark = stream_.mark();
    if (receives) stream_.compute_waits(mark);
    for (const PipelineMessage& m : group) {
      if (!m.send) continue;
      const PipelineOp& op = ops_[m.op];
      pending_send(plan_.model_chunk(op.chunk), sets_.set_of(op.microbatch)) = mark;
    }
  }

  // Before a pass of model chunk k in activation set `set`: the buffers it writes are not being sent.
  void before_pass(int k, int set) {
    int& mark = pending_send(k, set);
    stream_.compute_waits(mark);
    mark = -1;
  }

  // The compute stream waits for every message (the step's end).
  void finish() {
    pipeline_.wait_sends();
    stream_.join();
  }

 private:
  int& pending_send(int k, int set) {
    auto& marks = sending_[static_cast<size_t>(k)];
    if (marks.size() <= static_cast<size_t>(set)) marks.resize(static_cast<size_t>(set) + 1, -1);
    return marks[static_cast<size_t>(set)];
  }

  const PipelinePlan& plan_;
  const std::vector<PipelineOp>& ops_;
  Communicator& pipeline_;
  Transformer& model_;
  const SetTracker& sets_;
  SideStream& stream_;
  std::vector<std::vector<int>> sending_;  // [chunk][set]: the mark after the last group sending its buffers
};

}  // namespace

void run_pipeline_step(const PipelinePlan& plan, Communicator& pipeline, SideStream& messages, Transformer& model,
                       ParamStore& store, const PipelineStepInput& in, PassTimer& timer) {
  MOE_CHECK(plan.messages.size() == plan.ops.size() + 1, "pipeline: ", plan.messages.size(),
            " message groups for ", plan.ops.size(), " passes");
  timer.start();
  SetTracker sets(model.chunks(), plan.activation_sets);
  MessageIssuer issuer(plan, plan.ops, pipeline, model, sets, messages);
  const ModelWeights& w = store.weights();
  const ModelWeights& g = store.grads();
  for (size_t j = 0; j < plan.ops.size(); ++j) {
    const PipelineOp& op = plan.ops[j];
    const int k = plan.model_chunk(op.chunk), set = sets.set_of(op.microbatch);
    const int64_t i = op.microbatch, R = in.rows;
    const Tensor tokens = in.tokens.rows(i * R, (i + 1) * R), targets = in.targets.rows(i * R, (i + 1) * R);
    issuer.issue(plan.messages[j]);
    // The window's last microbatch ends each chunk's backward passes (every schedule runs a
    // chunk's backwards in microbatch order), and the rank's chunks finish from the highest down,
    // so the blocks complete in the order the store's overlapped reduction plans for.
    store.begin_microbatch(!op.forward && i == plan.shape.microbatches - 1);
    issuer.before_pass(k, set);
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
  issuer.issue(plan.messages.back());
  issuer.finish();  // every message of the step has been received: nothing crosses into the next one
  timer.stop();
}

void run_pipeline_forward(const PipelinePlan& plan, Communicator& pipeline, SideStream& messages, Transformer& model,
                          ParamStore& store, const PipelineStepInput& in) {
  // One microbatch through this rank's chunks, in activation set 0; the messages in per-pass
  // groups (pipeline_messages_test checks that they deliver without tags or buffering).
  const std::vector<PipelineOp>& ops = plan.eval_ops;
  const auto& groups = plan.eval_messages;
  const SetTracker sets(model.chunks(), 1);
  MessageIssuer issuer(plan, ops, pipeline, model, sets, messages);
  const ModelWeights& w = store.weights();
  for (size_t j = 0; j < ops.size(); ++j) {
    const int k = plan.model_chunk(ops[j].chunk);
    issuer.issue(groups[j]);
    issuer.before_pass(k, 0);
    model.chunk_forward_loss(k, 0, w, in.tokens, in.targets, in.routing_seed(0), in.routing, in.logits);
    if (model.has_head(k)) model.add_chunk_stats(in.stats, k, 0);
  }
  issuer.issue(groups.back());
  issuer.finish();
}

}  // namespace moe

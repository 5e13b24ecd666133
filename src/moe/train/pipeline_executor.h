// Runs one optimizer step's pipeline op list (parallel/pipeline_schedule.h) on this rank: each
// forward and backward of a microbatch through one of the rank's model chunks, with the chunk
// boundary's activations and their gradients as point-to-point messages to the neighbouring
// stages (Mesh::pipeline), issued in the groups of the plan's message list
// (parallel/pipeline_messages.h). Over MPI a send is a queued copy: no rank waits on a send, only
// on the receives the schedule's order makes it wait for, which cannot deadlock (simulate_pipeline
// checks every schedule). Over NCCL sends and receives are queued on a stream of their own
// (`messages`), and a send waits for its receiver; the groups make that deadlock-free too
// (message_order_problem checks every schedule, and the plan of each run), and the compute stream
// waits for a group only where a pass needs it. The step ends once its messages are received.
#pragma once

#include <cstdint>
#include <functional>

#include "moe/comm/mesh.h"
#include "moe/core/pass_timer.h"
#include "moe/core/side_stream.h"
#include "moe/model/transformer.h"
#include "moe/parallel/param_store.h"
#include "moe/train/run_model.h"

namespace moe {

struct PipelineStepInput {
  Tensor tokens, targets;  // the step's microbatches, [microbatches x rows] each
  int64_t rows = 0;        // tokens per microbatch
  StepScales scales;
  std::function<uint64_t(int64_t microbatch)> routing_seed;
  RoutingState routing;
  Tensor stats;  // F32 [kNumMicrobatchStats+]: each chunk's statistics are added after its backward
  Tensor logits;  // run_pipeline_forward, optional: the last stage writes the microbatch's logits [rows, V] here
};

// `timer` brackets the op list and each pass (read it once the device has finished the step: the
// bubble is its idle share).
void run_pipeline_step(const PipelinePlan& plan, Communicator& pipeline, SideStream& messages, Transformer& model,
                       ParamStore& store, const PipelineStepInput& in, PassTimer& timer);

// Forward only, one microbatch (evaluation; in.tokens holds its rows): the last stage adds its LM
// loss sum into stats[kStatLmSum].
void run_pipeline_forward(const PipelinePlan& plan, Communicator& pipeline, SideStream& messages, Transformer& model,
                          ParamStore& store, const PipelineStepInput& in);

}  // namespace moe

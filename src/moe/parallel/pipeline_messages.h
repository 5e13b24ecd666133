// The point-to-point messages of a pipeline step, in the order each rank issues them, and the
// check that they can be delivered by a transport without tags whose sends wait for their
// receivers (NCCL), not only by one that buffers sends and matches tags (MPI).
//
// A rank issues its messages in groups between its passes; a group's messages are in flight at
// once (ncclGroupStart / ncclGroupEnd), so two neighbours that each send before they receive do
// not wait for each other. Group j is issued before pass j, the last one after every pass:
//   - each pass's input is received in the group before it, and its output sent in the group
//     after it (1F1B's steady state then pairs a forward's output going one way with the next
//     backward's input coming the other: Megatron's send_forward_recv_backward);
//   - interleaved, where sends wait for receivers, each steady-state forward and the backward after
//     it exchange as one unit: both inputs received before the forward, both outputs sent after
//     the backward (Megatron's send_forward_backward_recv_forward_backward). The per-pass order
//     deadlocks there (a rank's lone send waits for a receive its neighbour posts only after a
//     send of its own that waits for this rank's next group: message_order_problem finds it).
#pragma once

#include <string>
#include <vector>

#include "moe/parallel/pipeline_schedule.h"

namespace moe {

struct PipelineMessage {
  bool send = false;
  int peer = 0;  // the pipeline rank at the other end
  int tag = 0;   // names the message (boundary, microbatch, direction); 0 .. 32767
  // The pass whose output (send) or input (receive) it is: an index into the rank's op list.
  size_t op = 0;
};

// The tag of the message across the boundary after chunk `boundary` for `microbatch` (activation
// forward, gradient backward): with MPI a rank receives each from the right pass whatever order
// its neighbour sent them in; without tags the orders must agree (message_order_problem).
int pipeline_message_tag(int64_t microbatch, int boundary, bool forward, int chunks);

// The groups of rank `rank` (ops.size() + 1 of them, each possibly empty) for its op list `ops`.
// `rendezvous`: the transport's sends wait for their receivers (Communicator::sends_wait_for_receivers).
std::vector<std::vector<PipelineMessage>> pipeline_message_groups(PipelineSchedule schedule,
                                                                  const std::vector<PipelineOp>& ops,
                                                                  const PipelineShape& shape, int rank,
                                                                  bool rendezvous);

// "" when every rank's groups (index = pipeline rank) complete under rendezvous semantics (a group
// blocks its rank until each of its messages has met its partner; the k-th send from a to b meets
// the k-th receive at b from a) and every such pair carries the same tag; else which ranks are
// blocked, or which messages would be paired with the wrong partner.
std::string message_order_problem(const std::vector<std::vector<std::vector<PipelineMessage>>>& groups);

}  // namespace moe

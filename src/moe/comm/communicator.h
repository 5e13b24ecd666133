// Communicator: the collectives the trainer needs, over one group of ranks. Implementations:
// MpiCommunicator (CPU buffers, OpenMPI) now; NcclCommunicator (device buffers) with the CUDA
// backend. Buffers are FP32 or I32 tensors; counts are in elements. All calls but the
// point-to-point ones (send, recv, wait_sends) are collective: every rank of the group must make
// them in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

enum class ReduceOp { Sum, Max };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: buf = op over ranks of buf.
  virtual void all_reduce(Tensor buf, ReduceOp op, Stream stream = {}) = 0;
  // in has size() * out.numel() elements; rank r receives the op-reduction of block r.
  virtual void reduce_scatter(Tensor out, Tensor in, ReduceOp op, Stream stream = {}) = 0;
  // out has size() * in.numel() elements: block r is rank r's in.
  virtual void all_gather(Tensor out, Tensor in, Stream stream = {}) = 0;
  // Variable all-to-all: send_counts[r] elements go to rank r (consecutive blocks of in, in rank
  // order); recv_counts[r] elements arrive from rank r (consecutive blocks of out). Counts are
  // host values: this is the host-synchronizing baseline path.
  virtual void all_to_all_v(Tensor out, const std::vector<int64_t>& recv_counts, Tensor in,
                            const std::vector<int64_t>& send_counts, Stream stream = {}) = 0;
  virtual void broadcast(Tensor buf, int root, Stream stream = {}) = 0;
  virtual void barrier() = 0;
  // Ranks with the same color form a new group, ordered by key (then by rank).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // Point-to-point (pipeline stages). Where sends_wait_for_receivers() is false (MPI), send copies
  // buf, queues the copy for rank `peer` and returns at once (buf may be written again right away),
  // and recv returns when buf holds the oldest message from `peer` with the same tag that it has not
  // received yet (tags: 0 .. 32767). Where it is true (NCCL), both are queued on the stream: a send
  // completes only once its receiver receives it, messages between two ranks are matched in the
  // order they are issued (tags are not sent), and the sends and receives a rank must have in flight
  // at once go between begin_group and end_group (parallel/pipeline_messages.h plans them). A
  // backend without point-to-point refuses (the default).
  virtual void send(Tensor buf, int peer, int tag, Stream stream = {});
  virtual void recv(Tensor buf, int peer, int tag, Stream stream = {});
  virtual void begin_group() {}
  virtual void end_group() {}
  virtual bool sends_wait_for_receivers() const { return false; }
  // Waits until every message this rank queued has been received (stream-ordered backends: nothing
  // to wait for on the host).
  virtual void wait_sends() {}
  // True for a stand-in that only plans memory (plan_communicator.h): the objects built on it
  // reserve their buffers but allocate no shared memory and make no collective.
  virtual bool plans_only() const { return false; }
  // True when another thread may make this group's collectives while the thread that owns the
  // backend makes other calls (MPI_THREAD_MULTIPLE): what a CommQueue's worker thread needs.
  virtual bool threads_may_call_concurrently() const { return false; }
};

}  // namespace moe

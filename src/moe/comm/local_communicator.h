// LocalCommunicator: a Communicator of one rank that needs no MPI. The trainer uses it when the
// process was not started by an MPI launcher (detect_launcher() in launcher.h), so a single-process run
// never initializes MPI. Collectives over one rank are identities: all_reduce, broadcast and
// barrier do nothing; reduce_scatter, all_gather and all_to_all_v copy in to out. Arguments are
// checked exactly as MpiCommunicator checks them, so a wrong call fails here too.
#pragma once

#include <memory>
#include <vector>

#include "moe/comm/communicator.h"

namespace moe {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(Tensor buf, ReduceOp op, Stream stream = {}) override;
  void reduce_scatter(Tensor out, Tensor in, ReduceOp op, Stream stream = {}) override;
  void all_gather(Tensor out, Tensor in, Stream stream = {}) override;
  void all_to_all_v(Tensor out, const std::vector<int64_t>& recv_counts, Tensor in,
                    const std::vector<int64_t>& send_counts, Stream stream = {}) override;
  void broadcast(Tensor buf, int root, Stream stream = {}) override;
  void barrier() override {}
  // A group of one has no other rank to message: refused, as MpiCommunicator refuses a message to itself.
  void send(Tensor buf, int peer, int tag, Stream stream = {}) override;
  void recv(Tensor buf, int peer, int tag, Stream stream = {}) override;
  bool threads_may_call_concurrently() const override { return true; }  // no backend to share
  // Every color makes another group of one.
  std::unique_ptr<Communicator> split(int color, int key) override;
};

}  // namespace moe

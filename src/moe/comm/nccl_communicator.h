// NcclCommunicator: the Communicator over GPU buffers (F32, BF16, I32), one rank per GPU,
// bootstrapped through any host communicator (MPI across processes, LocalCommunicator for one).
// Collectives are queued on the op's stream (the compute stream by default) and never wait on
// the host, so a step that uses them can be captured in a CUDA graph. all_to_all_v takes host
// counts (the baseline path); barrier() is the one call that waits for the device.
//
// NCCL's device API (the symmetric heap, nccl_symmetric_heap.cu) has no ABI guarantee: the NCCL
// loaded at run time must be the version of the headers this binary was built with, which
// create() checks (GPU.md: on the H200 machine, PyTorch's NCCL, first on LD_LIBRARY_PATH).
#pragma once

#include <memory>
#include <string>

#include "moe/comm/communicator.h"

namespace moe {

// True when this build has NCCL and the NCCL loaded at run time is the version it was built
// with; otherwise false with the reason in *why.
bool nccl_available(std::string* why = nullptr);

// Collective over `bootstrap`: rank 0 makes the unique id, bootstrap broadcasts it, every rank
// joins with its bootstrap rank. The current CUDA device must be this rank's GPU. Fails with the
// reason where NCCL is not available.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap);

// Defined only in builds with NCCL (MOE_HAVE_NCCL); made by make_nccl_communicator.

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(void* comm, int rank, int size);  // takes ownership of comm (an ncclComm_t)
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(Tensor buf, ReduceOp op, Stream stream = {}) override;
  void reduce_scatter(Tensor out, Tensor in, ReduceOp op, Stream stream = {}) override;
  void all_gather(Tensor out, Tensor in, Stream stream = {}) override;
  void all_to_all_v(Tensor out, const std::vector<int64_t>& recv_counts, Tensor in,
                    const std::vector<int64_t>& send_counts, Stream stream = {}) override;
  void broadcast(Tensor buf, int root, Stream stream = {}) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  // Pipeline messages: ncclSend / ncclRecv on the stream (tags only name them for the caller).
  void send(Tensor buf, int peer, int tag, Stream stream = {}) override;
  void recv(Tensor buf, int peer, int tag, Stream stream = {}) override;
  void begin_group() override;
  void end_group() override;
  bool sends_wait_for_receivers() const override { return true; }

  void* handle() const { return comm_; }  // ncclComm_t, for the symmetric heap

 private:
  void check_peer(const char* op, int peer) const;
  void* comm_ = nullptr;  // ncclComm_t
  int rank_ = 0, size_ = 1;
  void* barrier_scratch_ = nullptr;  // one device float for barrier()
};

}  // namespace moe

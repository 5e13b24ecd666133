// The OpenMPI implementation of Communicator, for CPU buffers.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "moe/comm/communicator.h"

namespace moe {

class MpiCommunicator final : public Communicator {
 public:
  // Wraps comm (not freed unless owned).
  explicit MpiCommunicator(MPI_Comm comm, bool owned = false);
  ~MpiCommunicator() override;
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
  // send is an MPI_Isend of a copy (kept until it completes), recv a blocking MPI_Recv: a rank that
  // sends never waits for its peer to reach the matching recv, so stages cannot deadlock on a send.
  // Under MPI_THREAD_MULTIPLE a thread tests the queued sends while the caller computes: over
  // shared memory a message above the eager limit moves only while its sender is inside MPI, so
  // without it the receiving stage waits for the sender's next MPI call, a whole pass later.
  void send(Tensor buf, int peer, int tag, Stream stream = {}) override;
  void recv(Tensor buf, int peer, int tag, Stream stream = {}) override;
  void wait_sends() override;
  // MPI was initialized with MPI_THREAD_MULTIPLE.
  bool threads_may_call_concurrently() const override;
  MPI_Comm comm() const { return comm_; }

 private:
  void check_peer(const char* op, int peer) const;
  MPI_Comm comm_;
  struct SendQueue;  // the queued sends (copies kept until they complete) and their progress thread
  std::unique_ptr<SendQueue> sends_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

// MPI_Init (once, thread level multiple where the library has it, at least funneled) / MPI_Finalize
// around main, and the world communicator. MPI_THREAD_MULTIPLE lets the gradient reduction run on a
// worker thread while the main thread computes and dispatches (CommQueue); without it the
// reduction runs on the main thread after the backward, with the same results.
// MPI_CHECK turns an MPI error code into moe::Error with the call and the MPI message.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  Communicator& world() { return *world_; }
  // Ends every rank of the job with a non-zero exit (after printing msg on this rank).
  [[noreturn]] static void abort_job(const char* msg, int code = 1);

 private:
  std::unique_ptr<MpiCommunicator> world_;
  // Added: MPI_Finalize only if this object called MPI_Init_thread (a test main or an embedding
  // program may own MPI instead).
  bool initialized_here_ = false;
};


}  // namespace moe

#define MPI_CHECK(call)                                                                     \
  do {                                                                                      \
    int moe_mpi_rc_ = (call);                                                               \
    if (moe_mpi_rc_ != MPI_SUCCESS) {                                                       \
      char moe_mpi_msg_[MPI_MAX_ERROR_STRING];                                              \
      int moe_mpi_len_ = 0;                                                                 \
      MPI_Error_string(moe_mpi_rc_, moe_mpi_msg_, &moe_mpi_len_);                           \
      MOE_FAIL(#call, " failed: ", std::string(moe_mpi_msg_, moe_mpi_len_));                \
    }                                                                                       \
  } while (0)

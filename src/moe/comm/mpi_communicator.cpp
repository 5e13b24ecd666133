// MpiCommunicator: the Communicator collectives over an MPI_Comm, for CPU tensors.
// NOTES: every communicator gets MPI_ERRORS_RETURN so a failing call returns a code that
// MPI_CHECK turns into moe::Error (the default handler would abort the job with no context).
// Argument checks run before any MPI call and need no communication (collective_checks.h).
#include "moe/comm/mpi_communicator.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "moe/comm/collective_checks.h"

namespace moe {

using namespace comm_detail;

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::I32: return MPI_INT;
    case DType::I64: return MPI_INT64_T;
    default: break;
  }
  MOE_FAIL("no MPI datatype for ", dtype_name(t));
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX; }

bool mpi_active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

}  // namespace

struct MpiCommunicator::SendQueue {
  struct QueuedSend {
    MPI_Request request;
    std::vector<char> copy;
  };
  std::mutex mu;
  std::condition_variable wake;
  std::vector<QueuedSend> sends;
  std::exception_ptr error;  // the progress thread's failure, rethrown by the next send or wait_sends
  bool stop = false;
  std::thread thread;

  // Frees the copies of completed sends. Under mu: a request is tested by one thread at a time.
  void reap() {
    for (size_t i = 0; i < sends.size();) {
      int done = 0;
      MPI_CHECK(MPI_Test(&sends[i].request, &done, MPI_STATUS_IGNORE));
      if (done) {
        sends[i] = std::move(sends.back());
        sends.pop_back();
      } else {
        ++i;
      }
    }
  }
  // Tests the queued sends every 100 us while there are any (asleep otherwise).
  void loop() {
    std::unique_lock lock(mu);
    for (;;) {
      wake.wait(lock, [&] { return stop || (!sends.empty() && !error); });
      if (stop) return;
      try {
        reap();
      } catch (...) {
        error = std::current_exception();
        continue;
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      lock.lock();
    }
  }
  void rethrow() {
    if (error) std::rethrow_exception(std::exchange(error, nullptr));
  }
  ~SendQueue() {
    if (!thread.joinable()) return;
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    wake.notify_all();
    thread.join();
  }
};

MpiCommunicator::MpiCommunicator(MPI_Comm comm, bool owned)
    : comm_(comm), sends_(std::make_unique<SendQueue>()), owned_(owned) {
  MOE_CHECK(comm != MPI_COMM_NULL, "MpiCommunicator: MPI_COMM_NULL is not a communicator");
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  sends_.reset();  // the progress thread stops before the communicator goes
  // No throwing here; after MPI_Finalize the handle is already gone.
  // Not while an exception unwinds: peers may be blocked elsewhere, and the job is being aborted.
  if (owned_ && comm_ != MPI_COMM_NULL && mpi_active() && std::uncaught_exceptions() == 0) MPI_Comm_free(&comm_);
}

void MpiCommunicator::all_reduce(Tensor buf, ReduceOp op, Stream) {
  check_cpu_tensor("all_reduce", "buf", buf, rank_);
  int n = checked_count("all_reduce", buf.numel(), rank_);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf.data, n, mpi_type(buf.dtype), mpi_op(op), comm_));
}

void MpiCommunicator::reduce_scatter(Tensor out, Tensor in, ReduceOp op, Stream) {
  check_reduce_scatter(out, in, size_, rank_);
  checked_count("reduce_scatter", in.numel(), rank_);
  int n = checked_count("reduce_scatter", out.numel(), rank_);
  MPI_CHECK(MPI_Reduce_scatter_block(in.data, out.data, n, mpi_type(in.dtype), mpi_op(op), comm_));
}

void MpiCommunicator::all_gather(Tensor out, Tensor in, Stream) {
  check_all_gather(out, in, size_, rank_);
  checked_count("all_gather", out.numel(), rank_);
  int n = checked_count("all_gather", in.numel(), rank_);
  MPI_Datatype t = mpi_type(in.dtype);
  MPI_CHECK(MPI_Allgather(in.data, n, t, out.data, n, t, comm_));
}

void MpiCommunicator::all_to_all_v(Tensor out, const std::vector<int64_t>& recv_counts, Tensor in,
                                   const std::vector<int64_t>& send_counts, Stream) {
  check_all_to_all_v(out, recv_counts, in, send_counts, size_, rank_);
  // Totals fit int, so every count and displacement does too.
  checked_count("all_to_all_v", in.numel(), rank_);
  checked_count("all_to_all_v", out.numel(), rank_);
  std::vector<int> send_n(size_), send_displ(size_), recv_n(size_), recv_displ(size_);
  int send_at = 0, recv_at = 0;
  for (int r = 0; r < size_; ++r) {
    send_n[r] = static_cast<int>(send_counts[r]);
    recv_n[r] = static_cast<int>(recv_counts[r]);
    send_displ[r] = send_at;
    recv_displ[r] = recv_at;
    send_at += send_n[r];
    recv_at += recv_n[r];
  }
  MPI_Datatype t = mpi_type(in.dtype);
  MPI_CHECK(MPI_Alltoallv(in.data, send_n.data(), send_displ.data(), t, out.data, recv_n.data(),
                          recv_displ.data(), t, comm_));
}

void MpiCommunicator::broadcast(Tensor buf, int root, Stream) {
  check_cpu_tensor("broadcast", "buf", buf, rank_);
  check_root(root, size_, rank_);
  int n = checked_count("broadcast", buf.numel(), rank_);
  MPI_CHECK(MPI_Bcast(buf.data, n, mpi_type(buf.dtype), root, comm_));
}

void MpiCommunicator::barrier() { MPI_CHECK(MPI_Barrier(comm_)); }

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  MOE_CHECK(color >= 0, "split (rank ", rank_, "): color ", color, " must be non-negative");
  MPI_Comm part = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(comm_, color, key, &part));
  return std::make_unique<MpiCommunicator>(part, /*owned=*/true);
}

void MpiCommunicator::check_peer(const char* op, int peer) const {
  MOE_CHECK(peer >= 0 && peer < size_ && peer != rank_, op, " (rank ", rank_, "): peer ", peer,
            " must be another rank of this group of ", size_);
}

void MpiCommunicator::send(Tensor buf, int peer, int tag, Stream) {
  check_cpu_tensor("send", "buf", buf, rank_);
  check_peer("send", peer);
  MOE_CHECK(tag >= 0 && tag <= 32767, "send (rank ", rank_, "): tag ", tag, " outside 0..32767");
  const int n = checked_count("send", buf.numel(), rank_);
  SendQueue& queue = *sends_;
  std::lock_guard lock(queue.mu);
  queue.rethrow();
  queue.reap();
  SendQueue::QueuedSend q{MPI_REQUEST_NULL, std::vector<char>(buf.nbytes())};
  std::memcpy(q.copy.data(), buf.data, buf.nbytes());
  MPI_CHECK(MPI_Isend(q.copy.data(), n, mpi_type(buf.dtype), peer, tag, comm_, &q.request));
  queue.sends.push_back(std::move(q));  // the vector's heap block does not move with it
  if (!queue.thread.joinable() && threads_may_call_concurrently())
    queue.thread = std::thread([&queue] { queue.loop(); });
  queue.wake.notify_one();
}

void MpiCommunicator::recv(Tensor buf, int peer, int tag, Stream) {
  check_cpu_tensor("recv", "buf", buf, rank_);
  check_peer("recv", peer);
  const int n = checked_count("recv", buf.numel(), rank_);
  MPI_Status status;
  MPI_CHECK(MPI_Recv(buf.data, n, mpi_type(buf.dtype), peer, tag, comm_, &status));
  int got = 0;
  MPI_CHECK(MPI_Get_count(&status, mpi_type(buf.dtype), &got));
  MOE_CHECK(got == n, "recv (rank ", rank_, "): rank ", peer, " sent ", got, " elements, ", n, " were expected");
}

void MpiCommunicator::wait_sends() {
  SendQueue& queue = *sends_;
  std::lock_guard lock(queue.mu);
  queue.rethrow();
  for (SendQueue::QueuedSend& q : queue.sends) MPI_CHECK(MPI_Wait(&q.request, MPI_STATUS_IGNORE));
  queue.sends.clear();
}

bool MpiCommunicator::threads_may_call_concurrently() const {
  int provided = MPI_THREAD_SINGLE;
  MPI_CHECK(MPI_Query_thread(&provided));
  return provided == MPI_THREAD_MULTIPLE;
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    initialized_here_ = true;
    // The main thread makes every call but the overlapped gradient reduction's, which a CommQueue
    // worker makes only under MPI_THREAD_MULTIPLE; OpenMP workers never call MPI.
    MOE_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI provides thread level ", provided,
              ", below MPI_THREAD_FUNNELED");
  }
  world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
}

MpiRuntime::~MpiRuntime() {
  world_.reset();
  if (initialized_here_ && mpi_active()) MPI_Finalize();
}

void MpiRuntime::abort_job(const char* msg, int code) {
  int rank = -1;
  bool active = mpi_active();
  if (active) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "error (rank %d): %s\n", rank, msg);
  std::fflush(stderr);
  if (active) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort should not return; without MPI there is nothing to abort
}


}  // namespace moe

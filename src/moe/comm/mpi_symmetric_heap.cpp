// The CPU SymmetricHeap: one MPI-3 shared-memory window over an EP group inside one node.
// NOTES:
// - The window stays in a passive-target epoch (MPI_Win_lock_all with MPI_MODE_NOCHECK) for the
//   heap's whole life, so plain loads and stores through peer() are legal; ordering comes from
//   sync() = MPI_Win_sync (memory barrier for the window) + group barrier + MPI_Win_sync, the
//   pattern the MPI-3 standard gives for the unified memory model (seen working on the CI
//   machine, GPU.md).
// - The heap duplicates the group's communicator, so its barriers are its own and the heap may
//   outlive the Communicator it was made from.
// - Every check that could fail on some ranks only is agreed by an all-reduce first, so all
//   ranks throw together instead of some waiting forever in the next collective.
#include <chrono>
#include <cstdint>
#include <memory>
#include <cstring>
#include <exception>
#include <vector>

#include "moe/comm/mpi_communicator.h"
#include "moe/comm/timed_communicator.h"
#include "moe/comm/symmetric_heap.h"

namespace moe {

namespace {

bool mpi_active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// True on every rank when cond holds on every rank of comm.
bool all_ranks_agree(bool cond, MPI_Comm comm) {
  int local = cond ? 1 : 0, all = 0;
  MPI_CHECK(MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, comm));
  return all == 1;
}

class MpiSymmetricHeap final : public SymmetricHeap {
 public:
  MpiSymmetricHeap(MPI_Comm group, size_t bytes_per_rank, std::shared_ptr<double> clock = nullptr)
      : clock_(std::move(clock)), bytes_per_rank_(bytes_per_rank) {
    MPI_CHECK(MPI_Comm_dup(group, &comm_));
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    try {
      create();
    } catch (...) {
      release();
      throw;
    }
  }
  ~MpiSymmetricHeap() override { release(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t bytes_per_rank() const override { return bytes_per_rank_; }
  void* local() override { return peer_base_[rank_]; }

  void* peer(const void* local_ptr, int peer_rank) override {
    MOE_CHECK(peer_rank >= 0 && peer_rank < size_, "symmetric heap (rank ", rank_, "): peer rank ",
              peer_rank, " is not in this group of ", size_);
    // Offsets may reach the end of the segment (an end pointer), never beyond it.
    const auto at = reinterpret_cast<uintptr_t>(local_ptr);
    const auto base = reinterpret_cast<uintptr_t>(peer_base_[rank_]);
    MOE_CHECK(at >= base && at - base <= bytes_per_rank_, "symmetric heap (rank ", rank_,
              "): pointer ", local_ptr, " is outside this rank's segment [", peer_base_[rank_],
              ", +", bytes_per_rank_, " bytes)");
    return peer_base_[peer_rank] + (at - base);
  }

  void sync() override {
    const auto t0 = std::chrono::steady_clock::now();
    MPI_CHECK(MPI_Win_sync(win_));
    MPI_CHECK(MPI_Barrier(comm_));
    MPI_CHECK(MPI_Win_sync(win_));
    if (clock_) *clock_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  void create() {
    // One node: every rank of the group must be in this rank's shared-memory domain.
    MPI_Comm node = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    int node_size = 0;
    int rc = MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    MPI_CHECK(rc);
    MOE_CHECK(all_ranks_agree(node_size == size_, comm_), "symmetric heap (rank ", rank_,
              "): the EP group spans several nodes; the CPU symmetric heap needs one node (",
              node_size, " of the group's ", size_, " ranks share this rank's node)");

    // The same size everywhere, so peer() offsets mean the same thing on every rank.
    unsigned long long bytes = bytes_per_rank_, min_bytes = 0, max_bytes = 0;
    MPI_CHECK(MPI_Allreduce(&bytes, &min_bytes, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm_));
    MPI_CHECK(MPI_Allreduce(&bytes, &max_bytes, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm_));
    MOE_CHECK(min_bytes == max_bytes, "symmetric heap (rank ", rank_, "): ranks ask for ",
              "different segment sizes (", min_bytes, " to ", max_bytes,
              " bytes); every rank must ask for the same");
    MOE_CHECK(bytes_per_rank_ > 0, "symmetric heap (rank ", rank_,
              "): bytes_per_rank must be positive");
    MOE_CHECK(bytes_per_rank_ <= static_cast<size_t>(INT64_MAX), "symmetric heap: ",
              bytes_per_rank_, " bytes per rank do not fit MPI_Aint");

    void* base = nullptr;
    MPI_CHECK(MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes_per_rank_), /*disp_unit=*/1,
                                      MPI_INFO_NULL, comm_, &base, &win_));
    MPI_CHECK(MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN));
    peer_base_.resize(size_);
    for (int r = 0; r < size_; ++r) {
      MPI_Aint peer_bytes = 0;
      int disp_unit = 0;
      void* peer_ptr = nullptr;
      MPI_CHECK(MPI_Win_shared_query(win_, r, &peer_bytes, &disp_unit, &peer_ptr));
      MOE_CHECK(static_cast<size_t>(peer_bytes) == bytes_per_rank_ && peer_ptr != nullptr,
                "symmetric heap (rank ", rank_, "): peer ", r, "'s segment has ", peer_bytes,
                " bytes, expected ", bytes_per_rank_);
      peer_base_[r] = static_cast<char*>(peer_ptr);
    }
    MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_));
    locked_ = true;
    // Zeros first, visible to everyone before any peer stores into this segment.
    std::memset(peer_base_[rank_], 0, bytes_per_rank_);
    sync();
  }

  // Collective on every rank; no throwing (runs from the destructor).
  void release() {
    if (!mpi_active()) return;
    // NOTES: while an exception unwinds (one rank failed), the other ranks are not coming to this
    // collective; freeing the window would wait forever instead of letting the error reach
    // main(), which aborts the job. The process is about to end, so leave the window alone.
    if (std::uncaught_exceptions() > 0) return;
    if (locked_) MPI_Win_unlock_all(win_);
    locked_ = false;
    if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  std::shared_ptr<double> clock_;  // time in sync() counts as communication (TimedCommunicator's clock)
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  bool locked_ = false;
  int rank_ = 0, size_ = 1;
  size_t bytes_per_rank_;
  std::vector<char*> peer_base_;  // every rank's segment, mapped into this process
};

}  // namespace

std::unique_ptr<SymmetricHeap> make_mpi_symmetric_heap(Communicator& group, size_t bytes_per_rank) {
  Communicator* inner = &group;
  std::shared_ptr<double> clock;
  while (auto* timed = dynamic_cast<TimedCommunicator*>(inner)) {  // see through timing, keep its clock
    clock = timed->clock();
    inner = &timed->inner();
  }
  auto* mpi = dynamic_cast<MpiCommunicator*>(inner);
  MOE_CHECK(mpi != nullptr, "make_mpi_symmetric_heap: the group is not an MpiCommunicator (",
            "the CPU symmetric heap is an MPI shared-memory window; a LocalCommunicator or ",
            "NCCL group cannot back it)");
  return std::make_unique<MpiSymmetricHeap>(mpi->comm(), bytes_per_rank, clock);
}

}  // namespace moe

// SymmetricHeap: every rank of a group allocates the same number of bytes, and any rank can
// load from and store to any peer's segment directly. CPU: one MPI-3
// shared-memory window (MPI_Win_allocate_shared) over the group, which must lie inside one node.
// CUDA: NCCL registered windows with LSA pointers (nccl_symmetric_heap.cu): local() and peer()
// are device addresses, and sync() is a device-side barrier queued on the compute stream.
// Ordering: stores to a peer become visible to it after sync() (window sync + group barrier),
// which every rank of the group calls collectively.
#pragma once

#include <cstddef>
#include <memory>

#include "moe/comm/communicator.h"

namespace moe {

class SymmetricHeap {
 public:
  virtual ~SymmetricHeap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual size_t bytes_per_rank() const = 0;
  // This rank's segment.
  virtual void* local() = 0;
  // The address of the same offset in peer's segment as `local_ptr` has in ours.
  virtual void* peer(const void* local_ptr, int peer_rank) = 0;
  // Completes this rank's stores and waits until every rank of the group has done the same.
  virtual void sync() = 0;
};

// Collective over `group` (an MpiCommunicator whose ranks share one node).
std::unique_ptr<SymmetricHeap> make_mpi_symmetric_heap(Communicator& group, size_t bytes_per_rank);
// Collective over `group` (an NCCL communicator whose GPUs share one NVLink domain); zero-filled.
std::unique_ptr<SymmetricHeap> make_nccl_symmetric_heap(Communicator& group, size_t bytes_per_rank);

}  // namespace moe

// SymmetricHeap on NCCL registered windows: one ncclMemAlloc
// segment per rank, registered as a symmetric window; peers' segments are reached by plain loads
// and stores through LSA (load/store accessible) pointers, and sync() is an LSA barrier run by a
// kernel on the compute stream, so the heap never waits on the host and can be captured in a
// CUDA graph. The peer base addresses are read once at creation (outside any step).
#include "moe/comm/symmetric_heap.h"

#include "moe/core/error.h"

#if defined(MOE_HAVE_NCCL)
#include <nccl.h>
#include <nccl_device.h>

#include <vector>

#include "moe/comm/nccl_communicator.h"
#include "moe/comm/timed_communicator.h"
#include "moe/core/cuda_check.h"

#define NCCL_HEAP_CHECK(call)                                                                       \
  do {                                                                                              \
    const ncclResult_t moe_nccl_rc_ = (call);                                                       \
    if (moe_nccl_rc_ != ncclSuccess) MOE_FAIL(#call, " failed: ", ncclGetErrorString(moe_nccl_rc_)); \
  } while (0)
#endif

namespace moe {

#if defined(MOE_HAVE_NCCL)
namespace {

__global__ void lsa_peer_bases_kernel(ncclWindow_t win, int peers, void** out) {
  const int p = static_cast<int>(threadIdx.x);
  if (p < peers) out[p] = ncclGetLsaPointer(win, 0, p);
}

// Every rank's earlier stores (on this stream) become visible to every rank before any rank's
// later loads: release on arrive, acquire on wait.
__global__ void lsa_barrier_kernel(ncclDevComm comm) {
  ncclLsaBarrierSession<ncclCoopCta> barrier(ncclCoopCta(), comm, ncclTeamTagLsa(), 0);
  barrier.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

class NcclSymmetricHeap final : public SymmetricHeap {
 public:
  NcclSymmetricHeap(NcclCommunicator& group, size_t bytes) : group_(group), bytes_(bytes) {
    const ncclComm_t comm = static_cast<ncclComm_t>(group.handle());
    NCCL_HEAP_CHECK(ncclMemAlloc(&base_, bytes));
    CUDA_CHECK(cudaMemset(base_, 0, bytes));
    NCCL_HEAP_CHECK(ncclCommWindowRegister(comm, base_, bytes, &win_, NCCL_WIN_COLL_SYMMETRIC));
    ncclDevCommRequirements reqs{};  // 2.28 has no NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER (GPU.md)
    reqs.lsaBarrierCount = 1;
    NCCL_HEAP_CHECK(ncclDevCommCreate(comm, &reqs, &dev_comm_));
    MOE_CHECK(dev_comm_.lsaSize == group.size(), "NCCL symmetric heap: ", group.size(), " ranks but only ",
              dev_comm_.lsaSize, " reach each other by load/store (LSA); the rowwise backend needs one NVLink domain");
    void** bases = nullptr;
    CUDA_CHECK(cudaMalloc(&bases, sizeof(void*) * static_cast<size_t>(group.size())));
    lsa_peer_bases_kernel<<<1, 1024, 0, compute_stream()>>>(win_, group.size(), bases);
    CUDA_CHECK_LAUNCH();
    peers_.resize(static_cast<size_t>(group.size()));
    CUDA_CHECK(cudaMemcpyAsync(peers_.data(), bases, sizeof(void*) * peers_.size(), cudaMemcpyDeviceToHost,
                               compute_stream()));
    CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
    cudaFree(bases);
    MOE_CHECK(peers_[static_cast<size_t>(group.rank())] != nullptr, "NCCL symmetric heap: no LSA pointer to this rank");
    group.barrier();  // every segment is registered and zeroed before anyone stores into it
  }

  ~NcclSymmetricHeap() override {  // no throwing from a destructor
    const ncclComm_t comm = static_cast<ncclComm_t>(group_.handle());
    ncclDevCommDestroy(comm, &dev_comm_);
    ncclCommWindowDeregister(comm, win_);
    ncclMemFree(base_);
  }

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  size_t bytes_per_rank() const override { return bytes_; }
  void* local() override { return base_; }
  void* peer(const void* local_ptr, int peer_rank) override {
    const auto offset = static_cast<size_t>(static_cast<const char*>(local_ptr) - static_cast<const char*>(base_));
    MOE_CHECK(offset < bytes_ && peer_rank >= 0 && peer_rank < size(), "NCCL symmetric heap: pointer outside the "
              "local segment or peer ", peer_rank, " outside [0, ", size(), ")");
    return static_cast<char*>(peers_[static_cast<size_t>(peer_rank)]) + offset;
  }
  void sync() override {
    lsa_barrier_kernel<<<1, 128, 0, compute_stream()>>>(dev_comm_);
    CUDA_CHECK_LAUNCH();
  }

 private:
  NcclCommunicator& group_;
  size_t bytes_;
  void* base_ = nullptr;
  ncclWindow_t win_{};
  ncclDevComm dev_comm_{};
  std::vector<void*> peers_;
};

}  // namespace

std::unique_ptr<SymmetricHeap> make_nccl_symmetric_heap(Communicator& group, size_t bytes_per_rank) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&untimed(group));
  MOE_CHECK(nccl != nullptr, "NCCL symmetric heap: the group must be an NCCL communicator");
  MOE_CHECK(bytes_per_rank > 0, "NCCL symmetric heap: bytes_per_rank must be > 0");
  return std::make_unique<NcclSymmetricHeap>(*nccl, bytes_per_rank);
}

#else

std::unique_ptr<SymmetricHeap> make_nccl_symmetric_heap(Communicator&, size_t) {
  MOE_FAIL("NCCL symmetric heap: this binary was built without NCCL");
}

#endif

}  // namespace moe

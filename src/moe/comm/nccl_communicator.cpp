#include "moe/comm/nccl_communicator.h"

#include <cstring>

#include "moe/comm/collective_checks.h"
#include "moe/core/error.h"

#if defined(MOE_HAVE_NCCL)
#include <nccl.h>

#include "moe/core/cuda_check.h"

#define NCCL_CHECK(call)                                                                          \
  do {                                                                                            \
    const ncclResult_t moe_nccl_rc_ = (call);                                                     \
    if (moe_nccl_rc_ != ncclSuccess)                                                              \
      MOE_FAIL(#call, " failed: ", ncclGetErrorString(moe_nccl_rc_), " (", ncclGetLastError(nullptr), ")"); \
  } while (0)
#endif

namespace moe {

#if defined(MOE_HAVE_NCCL)

using namespace comm_detail;

namespace {

ncclDataType_t nccl_type(const Tensor& t, const char* op, int rank) {
  switch (t.dtype) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    default: break;
  }
  MOE_FAIL(op, " (rank ", rank, "): dtype ", dtype_name(t.dtype), " is not supported (F32, BF16, I32, I64)");
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }

void check_gpu(const char* op, const char* name, const Tensor& t, int rank) {
  MOE_CHECK(t.device == Device::CUDA, op, " (rank ", rank, "): ", name, " is a ", device_name(t.device),
            " tensor; NCCL moves GPU buffers only");
  MOE_CHECK(t.numel() == 0 || t.data != nullptr, op, " (rank ", rank, "): ", name, " has no data pointer");
}

ncclComm_t as_comm(void* p) { return static_cast<ncclComm_t>(p); }

}  // namespace

bool nccl_available(std::string* why) {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) {
    if (why) *why = "ncclGetVersion failed";
    return false;
  }
  if (version != NCCL_VERSION_CODE) {
    if (why)
      *why = "the NCCL loaded at run time is version " + std::to_string(version) + ", this binary was built with " +
             std::to_string(NCCL_VERSION_CODE) +
             " (the device API has no ABI guarantee: put the matching libnccl first on LD_LIBRARY_PATH)";
    return false;
  }
  return true;
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap) {
  std::string why;
  MOE_CHECK(nccl_available(&why), "NCCL: ", why);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (bootstrap.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  static_assert(sizeof(ncclUniqueId) % sizeof(int32_t) == 0);
  bootstrap.broadcast(Tensor(&id, DType::I32, {static_cast<int64_t>(sizeof(id) / sizeof(int32_t))}), 0);
  ncclComm_t comm = nullptr;
  NCCL_CHECK(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()));
  return std::make_unique<NcclCommunicator>(comm, bootstrap.rank(), bootstrap.size());
}

NcclCommunicator::NcclCommunicator(void* comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {
  CUDA_CHECK(cudaMalloc(&barrier_scratch_, sizeof(float)));
  CUDA_CHECK(cudaMemset(barrier_scratch_, 0, sizeof(float)));
}

NcclCommunicator::~NcclCommunicator() {
  if (barrier_scratch_) cudaFree(barrier_scratch_);  // no throwing from a destructor
  if (comm_) ncclCommDestroy(as_comm(comm_));
}

void NcclCommunicator::all_reduce(Tensor buf, ReduceOp op, Stream stream) {
  check_gpu("all_reduce", "buf", buf, rank_);
  NCCL_CHECK(ncclAllReduce(buf.data, buf.data, static_cast<size_t>(buf.numel()), nccl_type(buf, "all_reduce", rank_),
                           nccl_op(op), as_comm(comm_), cuda_stream(stream)));
}

void NcclCommunicator::reduce_scatter(Tensor out, Tensor in, ReduceOp op, Stream stream) {
  check_gpu("reduce_scatter", "out", out, rank_);
  check_gpu("reduce_scatter", "in", in, rank_);
  check_same_dtype("reduce_scatter", out, in, rank_);
  MOE_CHECK(in.numel() == static_cast<int64_t>(size_) * out.numel(), "reduce_scatter (rank ", rank_, "): in has ",
            in.numel(), " elements, expected ", size_, " x ", out.numel());
  NCCL_CHECK(ncclReduceScatter(in.data, out.data, static_cast<size_t>(out.numel()),
                               nccl_type(out, "reduce_scatter", rank_), nccl_op(op), as_comm(comm_),
                               cuda_stream(stream)));
}

void NcclCommunicator::all_gather(Tensor out, Tensor in, Stream stream) {
  check_gpu("all_gather", "out", out, rank_);
  check_gpu("all_gather", "in", in, rank_);
  check_same_dtype("all_gather", out, in, rank_);
  MOE_CHECK(out.numel() == static_cast<int64_t>(size_) * in.numel(), "all_gather (rank ", rank_, "): out has ",
            out.numel(), " elements, expected ", size_, " x ", in.numel());
  NCCL_CHECK(ncclAllGather(in.data, out.data, static_cast<size_t>(in.numel()), nccl_type(in, "all_gather", rank_),
                           as_comm(comm_), cuda_stream(stream)));
}

void NcclCommunicator::all_to_all_v(Tensor out, const std::vector<int64_t>& recv_counts, Tensor in,
                                    const std::vector<int64_t>& send_counts, Stream stream) {
  check_gpu("all_to_all_v", "out", out, rank_);
  check_gpu("all_to_all_v", "in", in, rank_);
  check_same_dtype("all_to_all_v", out, in, rank_);
  check_counts("send_counts", send_counts, in, "in", size_, rank_);
  check_counts("recv_counts", recv_counts, out, "out", size_, rank_);
  const ncclDataType_t type = nccl_type(in, "all_to_all_v", rank_);
  const size_t elem = dtype_size(in.dtype);
  const cudaStream_t s = cuda_stream(stream);
  NCCL_CHECK(ncclGroupStart());
  int64_t send_at = 0, recv_at = 0;
  for (int r = 0; r < size_; ++r) {
    const auto sc = static_cast<size_t>(send_counts[static_cast<size_t>(r)]);
    const auto rc = static_cast<size_t>(recv_counts[static_cast<size_t>(r)]);
    if (sc > 0) NCCL_CHECK(ncclSend(static_cast<const char*>(in.data) + send_at * elem, sc, type, r, as_comm(comm_), s));
    if (rc > 0) NCCL_CHECK(ncclRecv(static_cast<char*>(out.data) + recv_at * elem, rc, type, r, as_comm(comm_), s));
    send_at += static_cast<int64_t>(sc);
    recv_at += static_cast<int64_t>(rc);
  }
  NCCL_CHECK(ncclGroupEnd());
}

void NcclCommunicator::broadcast(Tensor buf, int root, Stream stream) {
  check_gpu("broadcast", "buf", buf, rank_);
  check_root(root, size_, rank_);
  NCCL_CHECK(ncclBroadcast(buf.data, buf.data, static_cast<size_t>(buf.numel()), nccl_type(buf, "broadcast", rank_),
                           root, as_comm(comm_), cuda_stream(stream)));
}

void NcclCommunicator::barrier() {
  const cudaStream_t s = compute_stream();
  NCCL_CHECK(ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, as_comm(comm_), s));
  CUDA_CHECK(cudaStreamSynchronize(s));
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  MOE_CHECK(color >= 0, "split (rank ", rank_, "): color ", color, " must be non-negative");
  ncclComm_t sub = nullptr;
  NCCL_CHECK(ncclCommSplit(as_comm(comm_), color, key, &sub, nullptr));
  int rank = 0, size = 0;
  NCCL_CHECK(ncclCommUserRank(sub, &rank));
  NCCL_CHECK(ncclCommCount(sub, &size));
  return std::make_unique<NcclCommunicator>(sub, rank, size);
}

void NcclCommunicator::send(Tensor buf, int peer, int /*tag*/, Stream stream) {
  check_gpu("send", "buf", buf, rank_);
  check_peer("send", peer);
  NCCL_CHECK(ncclSend(buf.data, static_cast<size_t>(buf.numel()), nccl_type(buf, "send", rank_), peer,
                      as_comm(comm_), cuda_stream(stream)));
}

void NcclCommunicator::recv(Tensor buf, int peer, int /*tag*/, Stream stream) {
  check_gpu("recv", "buf", buf, rank_);
  check_peer("recv", peer);
  NCCL_CHECK(ncclRecv(buf.data, static_cast<size_t>(buf.numel()), nccl_type(buf, "recv", rank_), peer,
                      as_comm(comm_), cuda_stream(stream)));
}

void NcclCommunicator::begin_group() { NCCL_CHECK(ncclGroupStart()); }

void NcclCommunicator::end_group() { NCCL_CHECK(ncclGroupEnd()); }

void NcclCommunicator::check_peer(const char* op, int peer) const {
  MOE_CHECK(peer >= 0 && peer < size_ && peer != rank_, op, " (rank ", rank_, "): peer ", peer,
            " is not another rank of this group of ", size_);
}

#else  // no NCCL in this build

bool nccl_available(std::string* why) {
  if (why) *why = "this binary was built without NCCL (no CUDA backend, or nccl.h / libnccl not found)";
  return false;
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator&) {
  MOE_FAIL("NCCL: this binary was built without NCCL (no CUDA backend, or nccl.h / libnccl not found)");
}

#endif

}  // namespace moe

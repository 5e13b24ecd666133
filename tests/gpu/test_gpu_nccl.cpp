// The NCCL communicator and the symmetric heap on NCCL windows, on one GPU (one rank: NCCL
// refuses several ranks on one GPU, so the multi-rank math is covered by the CPU communicators'
// tests and by the multi-GPU runs of issue 7). Checks the wiring: device buffers in and out, the
// heap's peer pointers and device-side barrier, and that collectives and the barrier can be
// captured in a CUDA graph. Skipped with the reason where no GPU or no NCCL is usable.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "moe/comm/local_communicator.h"
#include "moe/comm/nccl_communicator.h"
#include "moe/comm/symmetric_heap.h"
#include "moe/core/arena.h"
#include "moe/core/device.h"
#include "moe/core/step_graph.h"

namespace moe {
namespace {

std::vector<float> iota(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i);
  return v;
}

std::vector<float> read(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  copy_from_tensor(v.data(), t);
  return v;
}

TEST(Nccl, OneRankCollectivesMoveDeviceBuffers) {
  MOE_SKIP_WITHOUT_NCCL();
  LocalCommunicator bootstrap;
  const std::unique_ptr<Communicator> nccl = make_nccl_communicator(bootstrap);
  ASSERT_EQ(nccl->size(), 1);
  ASSERT_EQ(nccl->rank(), 0);
  Arena arena("nccl test", Device::CUDA);
  const auto a = arena.reserve("a", DType::F32, {64}), b = arena.reserve("b", DType::F32, {64});
  arena.commit();
  const Tensor ta = arena.get(a), tb = arena.get(b);
  copy_to_tensor(ta, iota(64, 1.0f).data());
  nccl->all_reduce(ta, ReduceOp::Sum);
  nccl->all_reduce(ta, ReduceOp::Max);
  EXPECT_EQ(read(ta), iota(64, 1.0f));
  nccl->reduce_scatter(tb, ta, ReduceOp::Sum);
  EXPECT_EQ(read(tb), iota(64, 1.0f));
  copy_to_tensor(ta, iota(64, 7.0f).data());
  nccl->all_gather(tb, ta);
  EXPECT_EQ(read(tb), iota(64, 7.0f));
  copy_to_tensor(ta, iota(64, 3.0f).data());
  nccl->all_to_all_v(tb, {64}, ta, {64});
  EXPECT_EQ(read(tb), iota(64, 3.0f));
  nccl->broadcast(tb, 0);
  nccl->barrier();
  EXPECT_EQ(read(tb), iota(64, 3.0f));
  const std::unique_ptr<Communicator> sub = nccl->split(0, 0);
  EXPECT_EQ(sub->size(), 1);
  // Host buffers are refused with the tensor named.
  std::vector<float> host(4);
  try {
    nccl->all_reduce(Tensor(host.data(), DType::F32, {4}), ReduceOp::Sum);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL moves GPU buffers only"), std::string::npos) << e.what();
  }
}

TEST(Nccl, SymmetricHeapPeerPointersAndBarrierCaptureInAGraph) {
  MOE_SKIP_WITHOUT_NCCL();
  LocalCommunicator bootstrap;
  const std::unique_ptr<Communicator> nccl = make_nccl_communicator(bootstrap);
  const std::unique_ptr<SymmetricHeap> heap = make_nccl_symmetric_heap(*nccl, size_t{1} << 20);
  ASSERT_EQ(heap->size(), 1);
  char* local = static_cast<char*>(heap->local());
  float* peer = static_cast<float*>(heap->peer(local + 4096, 0));  // this rank through its LSA mapping
  const std::vector<float> v = iota(256, 5.0f);
  ASSERT_EQ(cudaMemcpy(peer, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  heap->sync();
  EXPECT_EQ(read(Tensor(local + 4096, DType::F32, {256}, Device::CUDA)), v);

  // A step's worth of NCCL work in one graph: an all-reduce, the heap barrier, an all-gather.
  Arena arena("nccl graph", Device::CUDA);
  const auto a = arena.reserve("a", DType::F32, {32}), b = arena.reserve("b", DType::F32, {32});
  arena.commit();
  const Tensor ta = arena.get(a), tb = arena.get(b);
  StepGraph graph;
  graph.capture([&] {
    nccl->all_reduce(ta, ReduceOp::Sum);
    heap->sync();
    nccl->all_gather(tb, ta);
  });
  EXPECT_GT(graph.nodes(), 0u);
  for (float base : {1.0f, 100.0f}) {
    copy_to_tensor(ta, iota(32, base).data());
    graph.replay();
    EXPECT_EQ(read(tb), iota(32, base));
  }
  EXPECT_THROW(make_nccl_symmetric_heap(bootstrap, 1024), Error);  // not an NCCL group
}

}  // namespace
}  // namespace moe

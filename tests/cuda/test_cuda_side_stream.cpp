// SideStream orders its stream against the compute stream by events alone: a copy queued on one
// stream after a wait does not run before the other stream's work it waits for. Each test holds
// one stream at a host gate (a host function that waits for the test's release), checks that the
// dependent copy on the other stream has not run 50 ms later, then opens the gate and checks the
// copied value. Without the wait the copy would run at once and read the old value.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "cuda_test_util.h"
#include "moe/core/side_stream.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
// Blocks `stream` until open() is called.
class HostGate {
 public:
  explicit HostGate(cudaStream_t stream) {
    CUDA_CHECK(cudaLaunchHostFunc(stream, [](void* p) {
      auto* open = static_cast<std::atomic<bool>*>(p);
      while (!open->load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }, &open_));
  }
  ~HostGate() { open(); }
  void open() { open_.store(true); }

 private:
  std::atomic<bool> open_{false};
};

bool finished_after_50ms(cudaEvent_t e) {
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return cudaEventQuery(e) == cudaSuccess;
}

int read_int(const void* device) {
  int v = 0;
  CUDA_CHECK(cudaMemcpy(&v, device, sizeof v, cudaMemcpyDeviceToHost));
  return v;
}

struct Buffers {
  int *a = nullptr, *b = nullptr;
  cudaEvent_t done = nullptr;
  Buffers() {
    CUDA_CHECK(cudaMalloc(&a, sizeof(int)));
    CUDA_CHECK(cudaMalloc(&b, sizeof(int)));
    CUDA_CHECK(cudaMemset(a, 0, sizeof(int)));
    CUDA_CHECK(cudaMemset(b, 0, sizeof(int)));
    CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~Buffers() {
    cudaEventDestroy(done);
    cudaFree(a);
    cudaFree(b);
  }
};
#endif

TEST(CudaSideStream, ComputeWaitsForAMarkOnly) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  Buffers buf;
  SideStream side(Device::CUDA);
  const auto s = static_cast<cudaStream_t>(side.stream().handle);
  HostGate gate(s);
  CUDA_CHECK(cudaMemsetAsync(buf.a, 1, sizeof(int), s));  // bytes 0x01: 0x01010101
  const int m = side.mark();
  CUDA_CHECK(cudaMemcpyAsync(buf.b, buf.a, sizeof(int), cudaMemcpyDeviceToDevice, compute_stream()));
  side.compute_waits(m);  // queued after the copy above: that copy does not wait
  CUDA_CHECK(cudaMemcpyAsync(buf.b, buf.a, sizeof(int), cudaMemcpyDeviceToDevice, compute_stream()));
  CUDA_CHECK(cudaEventRecord(buf.done, compute_stream()));
  EXPECT_FALSE(finished_after_50ms(buf.done)) << "the compute stream ran past a mark the side stream has not reached";
  gate.open();
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(read_int(buf.b), 0x01010101);
#endif
}

TEST(CudaSideStream, JoinWaitsForEverythingQueued) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  Buffers buf;
  SideStream side(Device::CUDA);
  const auto s = static_cast<cudaStream_t>(side.stream().handle);
  HostGate gate(s);
  CUDA_CHECK(cudaMemsetAsync(buf.a, 2, sizeof(int), s));
  side.join();
  CUDA_CHECK(cudaMemcpyAsync(buf.b, buf.a, sizeof(int), cudaMemcpyDeviceToDevice, compute_stream()));
  CUDA_CHECK(cudaEventRecord(buf.done, compute_stream()));
  EXPECT_FALSE(finished_after_50ms(buf.done)) << "the compute stream ran past a join";
  gate.open();
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(read_int(buf.b), 0x02020202);
#endif
}

TEST(CudaSideStream, FollowComputeWaitsForTheComputeStream) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  Buffers buf;
  SideStream side(Device::CUDA);
  const auto s = static_cast<cudaStream_t>(side.stream().handle);
  HostGate gate(compute_stream());
  CUDA_CHECK(cudaMemsetAsync(buf.a, 3, sizeof(int), compute_stream()));
  side.follow_compute();
  CUDA_CHECK(cudaMemcpyAsync(buf.b, buf.a, sizeof(int), cudaMemcpyDeviceToDevice, s));
  CUDA_CHECK(cudaEventRecord(buf.done, s));
  EXPECT_FALSE(finished_after_50ms(buf.done)) << "the side stream ran ahead of the compute stream it follows";
  gate.open();
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(read_int(buf.b), 0x03030303);
#endif
}

TEST(CudaSideStream, TheCpuHasNoSideStream) {
  SideStream side(Device::CPU);
  EXPECT_FALSE(side.active());
  EXPECT_EQ(side.mark(), -1);
  side.follow_compute();
  side.compute_waits(-1);
  side.join();
}

}  // namespace
}  // namespace moe

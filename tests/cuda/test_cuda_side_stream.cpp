// SideStream orders its stream against the compute stream by events alone: a copy queued on one
// stream after a wait does not run before the other stream's work it waits for. Each test holds
// one stream at a host gate (a host function that waits for the test's release), checks that the
// dependent copy on the other stream has not run 50 ms later, then opens the gate and checks the
// copied value. Without the wait the copy would run at once and read the old value.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "cuda_test_util.h"
#include "moe/core/side_stream.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
// Blocks `stream` until open() is called. The destructor opens it and waits for the stream, so
// the host function never outlives the flag it reads (also when a failed check throws).
class HostGate {
 public:
  explicit HostGate(cudaStream_t stream) : stream_(stream) {
    CUDA_CHECK(cudaLaunchHostFunc(stream, [](void* p) {
      auto* open = static_cast<std::atomic<bool>*>(p);
      while (!open->load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }, &open_));
  }
  ~HostGate() {
    open();
    cudaStreamSynchronize(stream_);  // no throwing from a destructor
  }
  void open() { open_.store(true); }

 private:
  cudaStream_t stream_;
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

// Holds `producer` at a gate, queues there a memset of a device word to bytes `byte`, calls
// order(), then queues on `consumer` a copy of that word: the copy must not run while the gate is
// shut, and must read the memset's value once it opens.
void expect_copy_waits(cudaStream_t producer, cudaStream_t consumer, int byte, const std::function<void()>& order,
                       const char* what) {
  int *a = nullptr, *b = nullptr;
  cudaEvent_t done = nullptr;
  CUDA_CHECK(cudaMalloc(&a, sizeof(int)));
  CUDA_CHECK(cudaMalloc(&b, sizeof(int)));
  CUDA_CHECK(cudaMemset(a, 0, sizeof(int)));
  CUDA_CHECK(cudaMemset(b, 0, sizeof(int)));
  CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CUDA_CHECK(cudaDeviceSynchronize());
  {
    HostGate gate(producer);
    CUDA_CHECK(cudaMemsetAsync(a, byte, sizeof(int), producer));
    order();
    CUDA_CHECK(cudaMemcpyAsync(b, a, sizeof(int), cudaMemcpyDeviceToDevice, consumer));
    CUDA_CHECK(cudaEventRecord(done, consumer));
    EXPECT_FALSE(finished_after_50ms(done)) << what;
    gate.open();
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  EXPECT_EQ(read_int(b), byte * 0x01010101) << what;
  cudaEventDestroy(done);
  cudaFree(a);
  cudaFree(b);
}
#endif

TEST(CudaSideStream, ComputeWaitsForAMark) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  SideStream side(Device::CUDA);
  expect_copy_waits(static_cast<cudaStream_t>(side.stream().handle), compute_stream(), 1,
                    [&] { side.compute_waits(side.mark()); }, "the compute stream ran past a mark not yet reached");
#endif
}

TEST(CudaSideStream, JoinWaitsForEverythingQueued) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  SideStream side(Device::CUDA);
  expect_copy_waits(static_cast<cudaStream_t>(side.stream().handle), compute_stream(), 2, [&] { side.join(); },
                    "the compute stream ran past a join");
#endif
}

TEST(CudaSideStream, FollowComputeWaitsForTheComputeStream) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  SideStream side(Device::CUDA);
  expect_copy_waits(compute_stream(), static_cast<cudaStream_t>(side.stream().handle), 3,
                    [&] { side.follow_compute(); }, "the side stream ran ahead of the compute stream it follows");
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

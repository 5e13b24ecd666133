// The device arena: planned buffers carved from one cudaMalloc, zero-filled, aligned, and a plan
// larger than the device fails naming the largest buffers.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "moe/core/arena.h"

namespace moe {
namespace {

TEST(CudaArena, BuffersAreZeroedAlignedAndDistinct) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  Arena arena("test", Device::CUDA);
  const Arena::Slot a = arena.reserve("a", DType::F32, {1000});
  const Arena::Slot b = arena.reserve("b", DType::BF16, {3, 7});
  arena.commit();
  const Tensor ta = arena.get(a), tb = arena.get(b);
  EXPECT_EQ(ta.device, Device::CUDA);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(tb.data) % 256, 0u);
  EXPECT_GE(static_cast<char*>(tb.data) - static_cast<char*>(ta.data), 4000);
  std::vector<float> host(1000, 1.0f);
  CUDA_CHECK(cudaMemcpy(host.data(), ta.data, 4000, cudaMemcpyDeviceToHost));
  for (float v : host) ASSERT_EQ(v, 0.0f);
#endif
}

TEST(CudaArena, PlanLargerThanTheDeviceNamesTheBuffer) {
  MOE_SKIP_WITHOUT_GPU();
  Arena arena("huge", Device::CUDA);
  arena.reserve("activations.too_big", DType::F32, {int64_t{1} << 40});  // 4 TiB
  try {
    arena.commit();
    FAIL() << "a 4 TiB device arena was granted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("activations.too_big"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moe

// CUDA rotary embedding against the CPU op, forward and backward, in place: F32 (normalized error
// <= 1e-5) and BF16 (inputs rounded to BF16 on the host before the CPU reference; <= 1e-2). Two
// runs on the same input give bit-identical results.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/rng.h"
#include "moe/ops/rope.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;
using testing::normalized_error;
using testing::round_bf16;

constexpr double kTolF32 = 1e-5;
constexpr double kTolBF16 = 1e-2;

std::vector<float> random_values(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

struct RopeCase {
  int64_t rows, seq_len, n_heads, hd;
  float theta;
};
// One pair, odd head counts and odd pair counts, a head dim of 128, and 4096 rows with positions
// up to 2047 (where an FP32 angle would be visibly off).
const RopeCase kCases[] = {{1, 1, 1, 2, 10000.0f},     {6, 3, 2, 6, 10000.0f},    {12, 4, 3, 10, 500.0f},
                           {512, 256, 4, 128, 1e6f},   {4096, 2048, 16, 64, 10000.0f}};

void check_rope(DType dtype, bool inverse) {
  const double tol = dtype == DType::F32 ? kTolF32 : kTolBF16;
  uint64_t seed = inverse ? 50 : 1;
  for (const auto& c : kCases) {
    const int64_t width = c.n_heads * c.hd;
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << (inverse ? " backward" : " forward") << " rows "
                                      << c.rows << " seq " << c.seq_len << " heads " << c.n_heads << " hd " << c.hd);
    auto x = random_values(c.rows * width, seed++);
    if (dtype == DType::BF16) x = round_bf16(x);
    auto ref = x;
    const Tensor ref_t = f32_tensor(ref.data(), {c.rows, width});
    if (inverse)
      rope_backward(ref_t, c.seq_len, c.n_heads, c.theta);
    else
      rope_forward(ref_t, c.seq_len, c.n_heads, c.theta);

    DeviceBuffer x_d(dtype, {c.rows, width});
    auto run = [&] {
      x_d.upload(x);
      if (inverse)
        rope_backward(x_d, c.seq_len, c.n_heads, c.theta);
      else
        rope_forward(x_d, c.seq_len, c.n_heads, c.theta);
      return x_d.download();
    };
    const auto out = run();
    EXPECT_LE(normalized_error(out, ref), tol);
    const auto again = run();
    EXPECT_EQ(std::memcmp(out.data(), again.data(), out.size() * sizeof(float)), 0) << "not deterministic";
  }
}
#endif

TEST(CudaRope, ForwardMatchesCpuF32) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  check_rope(DType::F32, /*inverse=*/false);
#endif
}

TEST(CudaRope, BackwardMatchesCpuF32) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  check_rope(DType::F32, /*inverse=*/true);
#endif
}

TEST(CudaRope, ForwardMatchesCpuBF16) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  check_rope(DType::BF16, /*inverse=*/false);
#endif
}

TEST(CudaRope, BackwardMatchesCpuBF16) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  check_rope(DType::BF16, /*inverse=*/true);
#endif
}

TEST(CudaRope, RejectsBadShapesAndDtypes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer odd_head(DType::F32, {4, 6}), ints(DType::I32, {4, 8});
  EXPECT_THROW(rope_forward(odd_head, 4, 2, 10000.0f), Error);  // hd = 3 is odd
  EXPECT_THROW(rope_forward(odd_head, 3, 1, 10000.0f), Error);  // 4 rows are not whole sequences of 3
  EXPECT_THROW(rope_forward(ints, 4, 2, 10000.0f), Error);
#endif
}

}  // namespace
}  // namespace moe

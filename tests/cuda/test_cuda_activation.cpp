// CUDA SwiGLU against the CPU op, forward and backward: F32 (normalized error <= 1e-5) and BF16
// (inputs rounded to BF16 on the host before the CPU reference; <= 1e-2). Outputs start
// poisoned, so an unwritten element fails; two runs give bit-identical results.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/rng.h"
#include "moe/ops/activation.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;
using testing::normalized_error;
using testing::round_bf16;

constexpr double kTolF32 = 1e-5;
constexpr double kTolBF16 = 1e-2;

std::vector<float> random_values(int64_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const int64_t kShapes[][2] = {{1, 1}, {3, 5}, {33, 1027}, {4096, 1024}};  // R, H

void check_swiglu(DType dtype) {
  const double tol = dtype == DType::F32 ? kTolF32 : kTolBF16;
  uint64_t seed = 1;
  for (const auto& s : kShapes) {
    const int64_t R = s[0], H = s[1];
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " R " << R << " H " << H);
    auto gate_up = random_values(R * 2 * H, seed++, 2.0);  // gates over the whole sigmoid range
    auto dout = random_values(R * H, seed++);
    if (dtype == DType::BF16) gate_up = round_bf16(gate_up), dout = round_bf16(dout);
    std::vector<float> out_ref(R * H), dgu_ref(R * 2 * H);
    swiglu_forward(f32_tensor(out_ref.data(), {R, H}), f32_tensor(gate_up.data(), {R, 2 * H}));
    swiglu_backward(f32_tensor(dgu_ref.data(), {R, 2 * H}), f32_tensor(dout.data(), {R, H}),
                    f32_tensor(gate_up.data(), {R, 2 * H}));

    DeviceBuffer gu_d(dtype, {R, 2 * H}), dout_d(dtype, {R, H}), out_d(dtype, {R, H}), dgu_d(dtype, {R, 2 * H});
    gu_d.upload(gate_up);
    dout_d.upload(dout);
    swiglu_forward(out_d, gu_d);
    swiglu_backward(dgu_d, dout_d, gu_d);
    const auto out = out_d.download(), dgu = dgu_d.download();
    EXPECT_LE(normalized_error(out, out_ref), tol);
    EXPECT_LE(normalized_error(dgu, dgu_ref), tol);
    swiglu_forward(out_d, gu_d);
    swiglu_backward(dgu_d, dout_d, gu_d);
    EXPECT_TRUE(same_bits(out_d.download(), out)) << "forward is not deterministic";
    EXPECT_TRUE(same_bits(dgu_d.download(), dgu)) << "backward is not deterministic";
    // The fused pass of recompute = experts: the forward's output bits and the same gradient.
    DeviceBuffer out2_d(dtype, {R, H}), dgu2_d(dtype, {R, 2 * H});
    swiglu_backward_with_output(dgu2_d, out2_d, dout_d, gu_d);
    EXPECT_TRUE(same_bits(out2_d.download(), out)) << "fused output differs from swiglu_forward";
    EXPECT_TRUE(same_bits(dgu2_d.download(), dgu)) << "fused gradient differs from swiglu_backward";
  }
}
#endif

TEST(CudaActivation, SwigluMatchesCpuF32) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  check_swiglu(DType::F32);
#endif
}

TEST(CudaActivation, SwigluMatchesCpuBF16) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  check_swiglu(DType::BF16);
#endif
}

TEST(CudaActivation, RejectsMixedDtypesAndBadShapes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer gu(DType::BF16, {2, 8}), out_f32(DType::F32, {2, 4}), out_wide(DType::BF16, {2, 8});
  EXPECT_THROW(swiglu_forward(out_f32, gu), Error);
  EXPECT_THROW(swiglu_forward(out_wide, gu), Error);
#endif
}

}  // namespace
}  // namespace moe

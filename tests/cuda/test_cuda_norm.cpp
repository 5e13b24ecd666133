// CUDA RMSNorm against the CPU op: F32 (normalized error <= 1e-5) and BF16 (inputs rounded to BF16
// on the host before the CPU reference; BF16 outputs within 1e-2, the F32 statistics rstd and the
// F32 accumulator dweight within 1e-5 because they are computed in FP32 from the same inputs).
// Outputs start poisoned, so an unwritten element fails; two runs give bit-identical results.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/rng.h"
#include "moe/ops/norm.h"

namespace moe {
namespace {

using testing::normalized_error;
using testing::round_bf16;

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;

constexpr double kTolF32 = 1e-5;
constexpr double kTolBF16 = 1e-2;
constexpr float kEps = 1e-6f;

std::vector<float> random_values(int64_t n, uint64_t seed, double scale = 1.0, double offset = 0.0) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(offset + scale * rng.normal());
  return v;
}

Shape make_shape(const std::vector<int64_t>& dims) {
  Shape s;
  for (int64_t d : dims) s.dims[s.ndim++] = d;
  return s;
}

// x shapes; the last dim is C. Odd sizes, one row, a 3-D per-head view, and many blocks. C a
// multiple of 8 takes the 16-byte path (BF16: 8 columns, F32: 4), with rows partly in registers
// (C = 2048) and beyond them (C = 4104); other C the scalar path. R = 37, 13 are not multiples of
// the 8 rows of a block.
const std::vector<std::vector<int64_t>> kShapes = {{1, 1},    {1, 7},      {3, 129},    {5, 4, 64},  {37, 2048},
                                                   {13, 24},  {13, 8},     {37, 4104},  {9, 1030},   {4096, 1024}};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_forward(DType dtype) {
  const double tol = dtype == DType::F32 ? kTolF32 : kTolBF16;
  uint64_t seed = 1;
  for (const auto& dims : kShapes) {
    const Shape shape = make_shape(dims);
    const int64_t C = dims.back(), R = shape.numel() / C;
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " x " << shape.str());
    auto x = random_values(R * C, seed++, 1.0, 0.3);
    auto w = random_values(C, seed++, 0.5, 1.0);
    if (dtype == DType::BF16) x = round_bf16(x), w = round_bf16(w);
    std::vector<float> out_ref(R * C), rstd_ref(R);
    rmsnorm_forward(f32_tensor(out_ref.data(), shape), f32_tensor(rstd_ref.data(), {R}), f32_tensor(x.data(), shape),
                    f32_tensor(w.data(), {C}), kEps);

    DeviceBuffer x_d(dtype, shape), w_d(dtype, {C}), out_d(dtype, shape), rstd_d(DType::F32, {R});
    x_d.upload(x);
    w_d.upload(w);
    rmsnorm_forward(out_d, rstd_d, x_d, w_d, kEps);
    const auto out = out_d.download(), rstd = rstd_d.download();
    EXPECT_LE(normalized_error(out, out_ref), tol);
    EXPECT_LE(normalized_error(rstd, rstd_ref), kTolF32);

    rmsnorm_forward(out_d, rstd_d, x_d, w_d, kEps);
    EXPECT_TRUE(same_bits(out_d.download(), out)) << "forward is not deterministic";
    EXPECT_TRUE(same_bits(rstd_d.download(), rstd)) << "rstd is not deterministic";
  }
}

void check_backward(DType dtype, bool accumulate_dx) {
  const double tol = dtype == DType::F32 ? kTolF32 : kTolBF16;
  uint64_t seed = 100;
  for (const auto& dims : kShapes) {
    const Shape shape = make_shape(dims);
    const int64_t C = dims.back(), R = shape.numel() / C;
    // C = 1 is ill-conditioned for dx: dx = rstd w g (1 - x^2 / (x^2 + eps)) is the difference of
    // two nearly equal FP32 terms (its true size is ~eps), so neither side has correct digits.
    if (C == 1) continue;
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " x " << shape.str() << " accumulate_dx "
                                      << accumulate_dx);
    auto x = random_values(R * C, seed++, 1.0, 0.3);
    auto w = random_values(C, seed++, 0.5, 1.0);
    auto g = random_values(R * C, seed++);
    auto dx0 = random_values(R * C, seed++);  // existing dx (used when accumulating)
    const auto dw0 = random_values(C, seed++);  // existing dweight: always accumulated into
    if (dtype == DType::BF16) x = round_bf16(x), w = round_bf16(w), g = round_bf16(g), dx0 = round_bf16(dx0);
    std::vector<float> out_ref(R * C), rstd(R);
    rmsnorm_forward(f32_tensor(out_ref.data(), shape), f32_tensor(rstd.data(), {R}), f32_tensor(x.data(), shape),
                    f32_tensor(w.data(), {C}), kEps);
    auto dx_ref = dx0;
    auto dw_ref = dw0;
    rmsnorm_backward(f32_tensor(dx_ref.data(), shape), f32_tensor(dw_ref.data(), {C}), f32_tensor(g.data(), shape),
                     f32_tensor(x.data(), shape), f32_tensor(w.data(), {C}), f32_tensor(rstd.data(), {R}),
                     accumulate_dx);

    DeviceBuffer x_d(dtype, shape), w_d(dtype, {C}), g_d(dtype, shape), dx_d(dtype, shape),
        rstd_d(DType::F32, {R}), dw_d(DType::F32, {C});
    x_d.upload(x);
    w_d.upload(w);
    g_d.upload(g);
    rstd_d.upload(rstd);
    auto run = [&] {
      if (accumulate_dx) dx_d.upload(dx0);  // otherwise dx stays poisoned: every element must be written
      dw_d.upload(dw0);
      rmsnorm_backward(dx_d, dw_d, g_d, x_d, w_d, rstd_d, accumulate_dx);
    };
    run();
    const auto dx = dx_d.download(), dw = dw_d.download();
    EXPECT_LE(normalized_error(dx, dx_ref), tol);
    EXPECT_LE(normalized_error(dw, dw_ref), kTolF32);
    run();
    EXPECT_TRUE(same_bits(dx_d.download(), dx)) << "dx is not deterministic";
    EXPECT_TRUE(same_bits(dw_d.download(), dw)) << "dweight is not deterministic";
  }
}
#endif

TEST(CudaNorm, ForwardMatchesCpuF32) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  check_forward(DType::F32);
#endif
}

TEST(CudaNorm, ForwardMatchesCpuBF16) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  check_forward(DType::BF16);
#endif
}

TEST(CudaNorm, BackwardMatchesCpuAndIsDeterministicF32) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  check_backward(DType::F32, /*accumulate_dx=*/false);
  check_backward(DType::F32, /*accumulate_dx=*/true);
#endif
}

TEST(CudaNorm, BackwardMatchesCpuAndIsDeterministicBF16) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  check_backward(DType::BF16, /*accumulate_dx=*/false);
  check_backward(DType::BF16, /*accumulate_dx=*/true);
#endif
}

TEST(CudaNorm, RejectsMixedDtypes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer x(DType::BF16, {2, 8}), w_f32(DType::F32, {8}), w(DType::BF16, {8}), out(DType::BF16, {2, 8}),
      rstd(DType::F32, {2}), rstd_bf16(DType::BF16, {2}), dw_bf16(DType::BF16, {8});
  EXPECT_THROW(rmsnorm_forward(out, rstd, x, w_f32, kEps), Error);
  EXPECT_THROW(rmsnorm_forward(out, rstd_bf16, x, w, kEps), Error);
  EXPECT_THROW(rmsnorm_backward(out, dw_bf16, x, x, w, rstd, false), Error);
#endif
}

}  // namespace
}  // namespace moe

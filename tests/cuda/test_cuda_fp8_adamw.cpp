// adamw_step_quantize_blocks on the GPU (one kernel: the AdamW update that writes the weight's FP8
// caches) against its definition run on the GPU: adamw_step, then fp8_quantize_blocks of the new
// param. Bit for bit: param, m, v, the codes and the scales of both orientations, over three steps,
// for weights [N, K] and experts [E, N, K] with partial blocks (N, K not multiples of 128), an odd K
// (no vector accesses), a param that starts off 16-byte alignment, FP32 and BF16 moments, the
// step's scalars from the host and from a schedule in device memory, and only one orientation
// asked for. A non-finite gradient norm leaves everything, caches included, as it was. Outputs start
// poisoned (0xff), so every code and scale must be written. MOE_BENCH=1 also times the fused
// kernel against the two passes it replaces at an expert matrix of bench-olmoe-4l's size.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/rng.h"
#include "moe/ops/fp8.h"
#include "moe/ops/fp8_adamw.h"
#include "moe/ops/optim.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::bytes_of;
using testing::DeviceBuffer;

std::vector<float> normal_values(int64_t n, uint64_t seed, double scale) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

Shape transposed(Shape s) {
  std::swap(s.dims[s.ndim - 1], s.dims[s.ndim - 2]);
  return s;
}

// One weight's optimizer state and caches on the GPU. offset: elements before param, grad, m and v
// in their buffers (1: off 16-byte alignment).
struct State {
  Shape shape;
  int64_t offset;
  DType moment;
  DeviceBuffer param, grad, m, v, codes, scales, codes_t, scales_t;
  State(Shape s, int64_t off, DType moment_dtype)
      : shape(s),
        offset(off),
        moment(moment_dtype),
        param(DType::F32, {s.numel() + off}),
        grad(DType::F32, {s.numel() + off}),
        m(moment_dtype, {s.numel() + off}),
        v(moment_dtype, {s.numel() + off}),
        codes(DType::FP8_E4M3, s),
        scales(DType::F32, fp8_scale_shape(s, Fp8Tiles::Blocks)),
        codes_t(DType::FP8_E4M3, transposed(s)),
        scales_t(DType::F32, fp8_scale_shape(transposed(s), Fp8Tiles::Blocks)) {
    const int64_t n = s.numel() + off;
    param.upload(normal_values(n, 1, 0.02));
    m.upload(std::vector<float>(static_cast<size_t>(n), 0.0f));
    v.upload(std::vector<float>(static_cast<size_t>(n), 0.0f));
  }
  Tensor at(const DeviceBuffer& b) const {
    const Tensor t = b.tensor();
    return Tensor(static_cast<char*>(t.data) + offset * static_cast<int64_t>(dtype_size(t.dtype)), t.dtype, shape,
                  Device::CUDA);
  }
  Fp8Tensor w() const { return {codes.tensor(), scales.tensor(), Fp8Tiles::Blocks}; }
  Fp8Tensor w_t() const { return {codes_t.tensor(), scales_t.tensor(), Fp8Tiles::Blocks}; }
};

void expect_same(const State& got, const State& want, bool with_t, const std::string& what) {
  EXPECT_EQ(bytes_of(got.param.tensor()), bytes_of(want.param.tensor())) << what << ": param";
  EXPECT_EQ(bytes_of(got.m.tensor()), bytes_of(want.m.tensor())) << what << ": m";
  EXPECT_EQ(bytes_of(got.v.tensor()), bytes_of(want.v.tensor())) << what << ": v";
  EXPECT_EQ(bytes_of(got.codes.tensor()), bytes_of(want.codes.tensor())) << what << ": codes";
  EXPECT_EQ(bytes_of(got.scales.tensor()), bytes_of(want.scales.tensor())) << what << ": scales";
  if (with_t) {
    EXPECT_EQ(bytes_of(got.codes_t.tensor()), bytes_of(want.codes_t.tensor())) << what << ": codes_t";
    EXPECT_EQ(bytes_of(got.scales_t.tensor()), bytes_of(want.scales_t.tensor())) << what << ": scales_t";
  }
}

AdamWConfig config() {
  AdamWConfig c;
  c.lr = 3e-3f;
  c.weight_decay = 0.1f;
  return c;
}
#endif

TEST(CudaFp8Adamw, FusedUpdateEqualsUpdateThenQuantizeBitForBit) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  struct Case {
    Shape shape;
    int64_t offset;
    DType moment;
    bool schedule, with_t;
  };
  const Case cases[] = {
      {{256, 384}, 0, DType::F32, false, true},        {{3, 200, 264}, 0, DType::F32, true, true},
      {{130, 129}, 0, DType::F32, false, true},        {{256, 384}, 1, DType::F32, true, true},
      {{2, 256, 512}, 0, DType::BF16, false, true},    {{200, 260}, 1, DType::BF16, true, true},
      {{384, 256}, 0, DType::F32, false, false},
  };
  for (const Case& c : cases) {
    const std::string what = c.shape.str() + " offset " + std::to_string(c.offset) + " " + std::string(dtype_name(c.moment)) +
                             (c.schedule ? " schedule" : " host scalars") + (c.with_t ? "" : " no w_t");
    SCOPED_TRACE(what);
    State fused(c.shape, c.offset, c.moment), plain(c.shape, c.offset, c.moment);
    DeviceBuffer norm_sq(DType::F32, {1}), schedule(DType::F32, {2});
    const AdamWConfig cfg = config();
    for (int64_t step = 1; step <= 3; ++step) {
      const auto g = normal_values(c.shape.numel() + c.offset, 10 + static_cast<uint64_t>(step), 1.0);
      fused.grad.upload(g);
      plain.grad.upload(g);
      norm_sq.upload({4.0f * static_cast<float>(step)});  // clip 1 / sqrt(4 step): active
      schedule.upload({cfg.lr * static_cast<float>(step), static_cast<float>(step)});
      const Tensor sched = c.schedule ? schedule.tensor() : Tensor();
      adamw_step_quantize_blocks(fused.at(fused.param), fused.at(fused.grad), fused.at(fused.m), fused.at(fused.v),
                                 norm_sq, 1.0f, cfg, step, fused.w(), c.with_t ? fused.w_t() : Fp8Tensor{}, {}, sched);
      adamw_step(plain.at(plain.param), plain.at(plain.grad), plain.at(plain.m), plain.at(plain.v), norm_sq, 1.0f, cfg,
                 step, {}, sched);
      fp8_quantize_blocks(plain.w(), c.with_t ? plain.w_t() : Fp8Tensor{}, plain.at(plain.param));
    }
    expect_same(fused, plain, c.with_t, what);

    // A non-finite norm: the step is skipped, nothing changes (caches included).
    const auto before_param = bytes_of(fused.param.tensor()), before_codes = bytes_of(fused.codes.tensor()),
               before_t = bytes_of(fused.codes_t.tensor()), before_m = bytes_of(fused.m.tensor());
    for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      norm_sq.upload({bad});
      adamw_step_quantize_blocks(fused.at(fused.param), fused.at(fused.grad), fused.at(fused.m), fused.at(fused.v),
                                 norm_sq, 1.0f, cfg, 4, fused.w(), c.with_t ? fused.w_t() : Fp8Tensor{});
      EXPECT_EQ(bytes_of(fused.param.tensor()), before_param);
      EXPECT_EQ(bytes_of(fused.m.tensor()), before_m);
      EXPECT_EQ(bytes_of(fused.codes.tensor()), before_codes);
      EXPECT_EQ(bytes_of(fused.codes_t.tensor()), before_t);
    }
  }
#endif
}

TEST(CudaFp8Adamw, RefusesCachesOfAnotherShape) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  State s({128, 256}, 0, DType::F32), other({256, 128}, 0, DType::F32);
  DeviceBuffer norm_sq(DType::F32, {1});
  EXPECT_THROW(adamw_step_quantize_blocks(s.at(s.param), s.at(s.grad), s.at(s.m), s.at(s.v), norm_sq, 1.0f, config(),
                                          1, other.w(), s.w_t()),
               Error);
  EXPECT_THROW(adamw_step_quantize_blocks(s.at(s.param), s.at(s.grad), s.at(s.m), s.at(s.v), norm_sq, 1.0f, config(),
                                          1, s.w(), s.w()),
               Error);
#endif
}

// The fused kernel against the two passes it replaces, at one expert matrix set of bench-olmoe-4l
// (64 experts x [2048, 2048], the gate/up weights), FP32 moments.
TEST(CudaFp8Adamw, TimingAgainstTwoPasses) {
  MOE_SKIP_WITHOUT_GPU();
  MOE_SKIP_UNLESS_BENCH("timing");
#if defined(MOE_HAVE_CUDA)
  const Shape shape{64, 2048, 2048};
  State s(shape, 0, DType::F32);
  s.grad.upload(normal_values(shape.numel(), 3, 1.0));
  DeviceBuffer norm_sq(DType::F32, {1});
  norm_sq.upload({1.0f});
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  auto time_ms = [&](auto&& fn) {
    fn(1);
    CUDA_CHECK(cudaEventRecord(start));
    constexpr int kReps = 10;
    for (int i = 0; i < kReps; ++i) fn(2 + i);
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms / kReps;
  };
  const float fused = time_ms([&](int64_t step) {
    adamw_step_quantize_blocks(s.at(s.param), s.at(s.grad), s.at(s.m), s.at(s.v), norm_sq, 1.0f, config(), step,
                               s.w(), s.w_t());
  });
  const float update = time_ms([&](int64_t step) {
    adamw_step(s.at(s.param), s.at(s.grad), s.at(s.m), s.at(s.v), norm_sq, 1.0f, config(), step);
  });
  const float quantize = time_ms([&](int64_t) { fp8_quantize_blocks(s.w(), s.w_t(), s.at(s.param)); });
  const double n = static_cast<double>(shape.numel());
  std::printf("adamw + FP8 caches, %s F32 moments: fused %.3f ms (%.0f GB/s at 30 B/element); update %.3f ms + "
              "quantize %.3f ms = %.3f ms\n",
              shape.str().c_str(), fused, 30.0 * n / (fused * 1e6), update, quantize, update + quantize);
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
#endif
}

}  // namespace
}  // namespace moe

// cuda::lm_head_cross_entropy against the CPU op on fresh random inputs: ignored rows, chunk sizes
// that do not divide R, vocabularies that are not a multiple of the block, vocabularies staged in
// shared memory (V % 4 == 0: 1000, 12004, 50304), BF16 h/W with BF16 or F32 gradients, loss only,
// all rows ignored, R = 0, determinism (plain and staged), out-of-range targets.
// Tolerances: loss_sum relative error <= 1e-5 (logits are F32 for both dtypes); gradients by
// normalized error, F32 <= 1e-4, BF16 inputs (rounded to BF16 before the CPU reference; the GPU
// also rounds the logit gradient to BF16) <= 1e-2. Ignored rows of dh must be exactly 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include "cuda_test_util.h"
#include "moe/ops/loss.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;

constexpr double kTolLoss = 1e-5;
constexpr double kTolGradF32 = 1e-4;
constexpr double kTolGradBf16 = 1e-2;

std::vector<float> random_values(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Targets in [0, V), every `ignore_every`-th row -1 (0: none ignored, 1: all ignored).
std::vector<int32_t> random_targets(int64_t R, int64_t V, int ignore_every, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dist(0, V - 1);
  std::vector<int32_t> t(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r)
    t[r] = (ignore_every > 0 && r % ignore_every == 0) ? -1 : static_cast<int32_t>(dist(rng));
  return t;
}

struct LossCase {
  int64_t R, D, V, chunk;
  int ignore_every;
  DType in, dh_dtype, dw_dtype;
  bool want_dh = true, want_dw = true;
  std::string str() const {
    std::ostringstream os;
    os << "R=" << R << " D=" << D << " V=" << V << " chunk=" << chunk << " ignore_every=" << ignore_every
       << " in=" << dtype_name(in) << " dh=" << (want_dh ? dtype_name(dh_dtype) : "none")
       << " dweight=" << (want_dw ? dtype_name(dw_dtype) : "none");
    return os.str();
  }
};

void expect_matches_cpu(const LossCase& c, uint32_t seed) {
  const bool bf16 = c.in == DType::BF16;
  std::vector<float> h = random_values(c.R * c.D, seed, 1.0f);
  std::vector<float> w = random_values(c.V * c.D, seed + 1, 0.5f);
  if (bf16) {
    h = testing::round_bf16(h);
    w = testing::round_bf16(w);
  }
  std::vector<int32_t> targets = random_targets(c.R, c.V, c.ignore_every, seed + 2);
  std::vector<float> dw0 = random_values(c.V * c.D, seed + 3, 0.1f);
  if (c.dw_dtype == DType::BF16) dw0 = testing::round_bf16(dw0);
  int64_t counted = 0;
  for (int32_t t : targets) counted += t >= 0;
  const float grad_scale = counted > 0 ? 1.0f / static_cast<float>(counted) : 1.0f;

  float loss_ref = -1.0f;
  std::vector<float> dh_ref(static_cast<size_t>(c.R * c.D), 0.0f), dw_ref = dw0;
  std::vector<float> ws(static_cast<size_t>(c.chunk * c.V));
  lm_head_cross_entropy(f32_tensor(&loss_ref, {1}), c.want_dh ? f32_tensor(dh_ref.data(), {c.R, c.D}) : Tensor(),
                        c.want_dw ? f32_tensor(dw_ref.data(), {c.V, c.D}) : Tensor(), f32_tensor(h.data(), {c.R, c.D}),
                        f32_tensor(w.data(), {c.V, c.D}), i32_tensor(targets.data(), {c.R}), grad_scale,
                        f32_tensor(ws.data(), {c.chunk, c.V}));

  DeviceBuffer dloss(DType::F32, {1}), dh(c.dh_dtype, {c.R, c.D}), ddw(c.dw_dtype, {c.V, c.D});
  DeviceBuffer dhid(c.in, {c.R, c.D}), dw(c.in, {c.V, c.D}), dt(DType::I32, {c.R}), dws(DType::F32, {c.chunk, c.V});
  dhid.upload(h);
  dw.upload(w);
  dt.upload_i32(targets);
  ddw.upload(dw0);  // dh stays poisoned: every element must be overwritten
  lm_head_cross_entropy(dloss, c.want_dh ? dh.tensor() : Tensor(), c.want_dw ? ddw.tensor() : Tensor(), dhid, dw, dt,
                        grad_scale, dws);
  const float loss = dloss.download()[0];
  const double loss_scale = std::max(1.0, std::fabs(static_cast<double>(loss_ref)));
  EXPECT_LE(std::fabs(static_cast<double>(loss) - loss_ref), kTolLoss * loss_scale)
      << c.str() << ": loss " << loss << " vs " << loss_ref;
  const double tol = bf16 ? kTolGradBf16 : kTolGradF32;
  if (c.want_dh) {
    const std::vector<float> got = dh.download();
    EXPECT_LE(testing::normalized_error(got, dh_ref), tol) << c.str() << ": dh";
    for (int64_t r = 0; r < c.R; ++r) {
      if (targets[r] >= 0) continue;
      for (int64_t j = 0; j < c.D; ++j) ASSERT_EQ(got[r * c.D + j], 0.0f) << c.str() << ": ignored row " << r;
    }
  }
  if (c.want_dw) {
    EXPECT_LE(testing::normalized_error(ddw.download(), dw_ref), tol) << c.str() << ": dweight";
  }
}
#endif

TEST(CudaLoss, F32MatchesCpuAcrossChunkings) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const DType F = DType::F32;
  uint32_t seed = 10;
  expect_matches_cpu({1, 16, 7, 4, 0, F, F, F}, seed += 5);       // one row, tiny vocabulary
  expect_matches_cpu({37, 24, 1000, 8, 5, F, F, F}, seed += 5);   // chunk does not divide R
  expect_matches_cpu({37, 24, 1000, 64, 3, F, F, F}, seed += 5);  // one partial chunk
  expect_matches_cpu({300, 64, 5003, 128, 7, F, F, F}, seed += 5);
  expect_matches_cpu({600, 96, 32011, 300, 4, F, F, F}, seed += 5);  // more rows per chunk than loss blocks
  // V % 4 == 0 with more than 4 words per staged-kernel thread (4 * 1024 logits): several words each;
  // then more rows per chunk than loss blocks (256), so a block stages row after row.
  expect_matches_cpu({40, 32, 12004, 16, 3, F, F, F}, seed += 5);
  expect_matches_cpu({600, 32, 12004, 600, 4, F, F, F}, seed += 5);
#endif
}

TEST(CudaLoss, Bf16MatchesCpuWithBf16OrF32Gradients) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const DType B = DType::BF16, F = DType::F32;
  uint32_t seed = 100;
  expect_matches_cpu({1, 16, 7, 4, 0, B, B, F}, seed += 5);
  expect_matches_cpu({37, 24, 1000, 8, 5, B, B, F}, seed += 5);
  expect_matches_cpu({37, 24, 1000, 8, 5, B, F, B}, seed += 5);
  expect_matches_cpu({300, 64, 5003, 128, 7, B, B, F}, seed += 5);
  expect_matches_cpu({600, 96, 32011, 256, 4, B, B, F}, seed += 5);
  expect_matches_cpu({70, 33, 513, 9, 2, B, B, B}, seed += 5);  // odd D: unaligned chunk pointers
  expect_matches_cpu({300, 32, 50304, 64, 5, B, B, B}, seed += 5);  // OLMoE's vocabulary, staged rows
  expect_matches_cpu({700, 32, 12004, 700, 3, B, B, B}, seed += 5);  // staged, several rows per block
#endif
}

TEST(CudaLoss, LossOnlyAndSingleGradients) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  for (DType in : {DType::F32, DType::BF16})
    for (int64_t V : {int64_t{777}, int64_t{1000}}) {  // the plain kernel, then the staged one
      LossCase c{45, 32, V, 16, 6, in, in, DType::F32};
      c.want_dh = false;
      c.want_dw = false;
      expect_matches_cpu(c, 200);
      c.want_dh = true;
      expect_matches_cpu(c, 210);
      c.want_dh = false;
      c.want_dw = true;
      expect_matches_cpu(c, 220);
    }
#endif
}

TEST(CudaLoss, AllRowsIgnoredGiveZeroLossAndGradients) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  for (DType in : {DType::F32, DType::BF16}) expect_matches_cpu({20, 16, 300, 6, 1, in, in, DType::F32}, 300);
#endif
}

TEST(CudaLoss, NoRowsGiveZeroLoss) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer loss(DType::F32, {1}), h(DType::F32, {0, 8}), w(DType::F32, {10, 8}), t(DType::I32, {0}),
      ws(DType::F32, {4, 10});
  lm_head_cross_entropy(loss, Tensor(), Tensor(), h, w, t, 1.0f, ws);
  EXPECT_EQ(loss.download()[0], 0.0f);
#endif
}

TEST(CudaLoss, RepeatedRunsAreBitIdentical) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  for (const int64_t V : {int64_t{4099}, int64_t{12004}}) {  // the plain kernel, then the staged one
    const int64_t R = 333, D = 48, chunk = 300;  // more rows per chunk than loss blocks
    DeviceBuffer h(DType::BF16, {R, D}), w(DType::BF16, {V, D}), t(DType::I32, {R}), ws(DType::F32, {chunk, V});
    h.upload(random_values(R * D, 1, 1.0f));
    w.upload(random_values(V * D, 2, 0.5f));
    t.upload_i32(random_targets(R, V, 9, 3));
    std::vector<float> results[2][3];
    for (auto& run : results) {
      DeviceBuffer loss(DType::F32, {1}), dh(DType::BF16, {R, D}), dw(DType::F32, {V, D});
      dw.upload(std::vector<float>(static_cast<size_t>(V * D), 0.0f));
      lm_head_cross_entropy(loss, dh, dw, h, w, t, 0.01f, ws);
      run[0] = loss.download();
      run[1] = dh.download();
      run[2] = dw.download();
    }
    for (int i = 0; i < 3; ++i) EXPECT_EQ(results[0][i], results[1][i]) << "V " << V << ", output " << i;
  }
#endif
}

TEST(CudaLoss, OutOfRangeTargetGivesNanLoss) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  for (const int64_t V : {int64_t{10}, int64_t{1000}}) {  // the plain kernel, then the staged one
    const int64_t R = 4, D = 8;
    DeviceBuffer loss(DType::F32, {1}), h(DType::F32, {R, D}), w(DType::F32, {V, D}), t(DType::I32, {R}),
        ws(DType::F32, {2, V});
    h.upload(random_values(R * D, 4, 1.0f));
    w.upload(random_values(V * D, 5, 1.0f));
    for (const int32_t bad : {static_cast<int32_t>(V), -5}) {
      t.upload_i32({1, 2, bad, 3});
      lm_head_cross_entropy(loss, Tensor(), Tensor(), h, w, t, 1.0f, ws);
      EXPECT_TRUE(std::isnan(loss.download()[0])) << "V " << V << ", target " << bad;
    }
  }
#endif
}

}  // namespace
}  // namespace moe

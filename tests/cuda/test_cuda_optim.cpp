// CUDA optimizer ops against the CPU ops (all F32). sum_squares_accumulate: relative error <= 1e-5
// against the CPU's double sum, accumulated into out, bit-identical over two runs, any shape.
// adamw_step: three steps with clipping active, inactive and off, param/m/v each within a
// normalized error of 1e-5 of the CPU op; an inf or NaN grad_norm_sq leaves param/m/v
// bit-identical (the skip is decided on the device). With a schedule (lr, step in device memory)
// adamw_step must give the bits of the same lr and step passed from the host, also when replayed
// from a captured CUDA graph. The float4 and one-by-one update paths give the same bits, and the
// BF16 copy written with param_bf16 is exactly the rounding of the new param. With BF16 moments the
// device gives the CPU op's bits on both paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/rng.h"
#include "moe/ops/optim.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;
using testing::normalized_error;

constexpr double kTol = 1e-5;

std::vector<float> random_values(int64_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
#endif

TEST(CudaOptim, SumSquaresMatchesCpuAndIsDeterministic) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  // One element, one block, several blocks, and more than 1024 * 256 elements (the grid is capped
  // at 1024 partials, so threads loop).
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}, int64_t{4096} * 1024, int64_t{30000001}}) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    const auto x = random_values(n, 1 + n);
    auto x_host = x;
    float want = 2.5f;
    sum_squares_accumulate(f32_tensor(&want, {1}), f32_tensor(x_host.data(), {n}), Tensor());

    DeviceBuffer x_d(DType::F32, {1, n, 1}), out_d(DType::F32, {1});  // any shape is accepted
    DeviceBuffer ws(DType::F32, {sum_squares_workspace_elems(Device::CUDA, n)});
    x_d.upload(x);
    out_d.upload({2.5f});
    sum_squares_accumulate(out_d, x_d, ws);
    const float got = out_d.download()[0];
    EXPECT_NEAR(got, want, kTol * want);
    out_d.upload({2.5f});
    sum_squares_accumulate(out_d, x_d, ws);
    const float again = out_d.download()[0];
    EXPECT_EQ(std::memcmp(&got, &again, 4), 0) << "not deterministic";
  }
  // Accumulating over two tensors equals one pass over their concatenation (within rounding).
  const auto x = random_values(5000, 9);
  DeviceBuffer a_d(DType::F32, {2000}), b_d(DType::F32, {3000}), all_d(DType::F32, {5000}), parts(DType::F32, {1}),
      whole(DType::F32, {1}), ws(DType::F32, {sum_squares_workspace_elems(Device::CUDA, 5000)});
  a_d.upload(std::vector<float>(x.begin(), x.begin() + 2000));
  b_d.upload(std::vector<float>(x.begin() + 2000, x.end()));
  all_d.upload(x);
  parts.upload({0.0f});
  whole.upload({0.0f});
  sum_squares_accumulate(parts, a_d, ws);
  sum_squares_accumulate(parts, b_d, ws);
  sum_squares_accumulate(whole, all_d, ws);
  const float p = parts.download()[0], w = whole.download()[0];
  EXPECT_NEAR(p, w, kTol * w);
#endif
}

TEST(CudaOptim, AdamwMatchesCpuOverThreeSteps) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  struct Case {
    float weight_decay, max_norm;
    int64_t n;
  };
  // Clipping active, a max_norm that does not clip, clipping off; odd and large sizes.
  const Case cases[] = {{0.1f, 1.0f, 1}, {0.0f, 1e6f, 777}, {0.1f, 0.0f, 100003}, {0.05f, 2.0f, 4096 * 1024}};
  uint64_t seed = 10;
  for (const auto& cs : cases) {
    SCOPED_TRACE(::testing::Message() << "wd " << cs.weight_decay << " max_norm " << cs.max_norm << " n " << cs.n);
    AdamWConfig cfg;
    cfg.lr = 1e-2f;
    cfg.weight_decay = cs.weight_decay;
    const int64_t n = cs.n;
    auto param = random_values(n, seed++);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    DeviceBuffer param_d(DType::F32, {n}), grad_d(DType::F32, {n}), m_d(DType::F32, {n}), v_d(DType::F32, {n}),
        norm_d(DType::F32, {1});
    param_d.upload(param);
    m_d.upload(m);
    v_d.upload(v);
    for (int step = 1; step <= 3; ++step) {
      auto grad = random_values(n, seed++, 0.01);
      float norm_sq = 0.0f;
      sum_squares_accumulate(f32_tensor(&norm_sq, {1}), f32_tensor(grad.data(), {n}), Tensor());
      // The same squared norm on both sides, so this checks the update alone.
      norm_d.upload({norm_sq});
      grad_d.upload(grad);
      adamw_step(f32_tensor(param.data(), {n}), f32_tensor(grad.data(), {n}), f32_tensor(m.data(), {n}),
                 f32_tensor(v.data(), {n}), f32_tensor(&norm_sq, {1}), cs.max_norm, cfg, step);
      adamw_step(param_d, grad_d, m_d, v_d, norm_d, cs.max_norm, cfg, step);
      EXPECT_LE(normalized_error(param_d.download(), param), kTol) << "param, step " << step;
      EXPECT_LE(normalized_error(m_d.download(), m), kTol) << "m, step " << step;
      EXPECT_LE(normalized_error(v_d.download(), v), kTol) << "v, step " << step;
    }
  }
#endif
}

// The norm computed on the device feeds the update on the device: no host round trip.
// Two sum_squares_accumulate calls running at once on two streams, each with its own workspace,
// give the bits of the same calls made one after the other (different n give different block
// counts, so calls that shared partial sums would mix them).
TEST(CudaOptim, SumSquaresOnTwoStreamsWithTheirOwnWorkspacesMatchesSerialCalls) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const int64_t na = 1 << 20, nb = 70001;
  DeviceBuffer xa(DType::F32, {na}), xb(DType::F32, {nb}), outa(DType::F32, {1}), outb(DType::F32, {1}),
      wsa(DType::F32, {sum_squares_workspace_elems(Device::CUDA, na)}),
      wsb(DType::F32, {sum_squares_workspace_elems(Device::CUDA, nb)});
  xa.upload(random_values(na, 21));
  xb.upload(random_values(nb, 22));
  outa.upload({0.0f});
  outb.upload({0.0f});
  sum_squares_accumulate(outa, xa, wsa);
  sum_squares_accumulate(outb, xb, wsb);
  const std::vector<float> a_serial = outa.download(), b_serial = outb.download();
  cudaStream_t s1 = nullptr, s2 = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  for (int rep = 0; rep < 50; ++rep) {
    CUDA_CHECK(cudaMemsetAsync(outa.tensor().data, 0, sizeof(float), s1));
    CUDA_CHECK(cudaMemsetAsync(outb.tensor().data, 0, sizeof(float), s2));
    sum_squares_accumulate(outa, xa, wsa, Stream{s1});
    sum_squares_accumulate(outb, xb, wsb, Stream{s2});
  }
  CUDA_CHECK(cudaStreamSynchronize(s1));
  CUDA_CHECK(cudaStreamSynchronize(s2));
  EXPECT_TRUE(same_bits(outa.download(), a_serial)) << "the call on stream 1 saw the other call's partial sums";
  EXPECT_TRUE(same_bits(outb.download(), b_serial)) << "the call on stream 2 saw the other call's partial sums";
  CUDA_CHECK(cudaStreamDestroy(s1));
  CUDA_CHECK(cudaStreamDestroy(s2));
#endif
}

TEST(CudaOptim, AdamwWithDeviceNormMatchesCpu) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const int64_t n = 100003;
  AdamWConfig cfg;
  cfg.weight_decay = 0.1f;
  auto param = random_values(n, 3);
  const auto grad = random_values(n, 4);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  DeviceBuffer param_d(DType::F32, {n}), grad_d(DType::F32, {n}), m_d(DType::F32, {n}), v_d(DType::F32, {n}),
      norm_d(DType::F32, {1}), norm_ws(DType::F32, {sum_squares_workspace_elems(Device::CUDA, n)});
  param_d.upload(param);
  grad_d.upload(grad);
  m_d.upload(m);
  v_d.upload(v);
  norm_d.upload({0.0f});
  sum_squares_accumulate(norm_d, grad_d, norm_ws);
  adamw_step(param_d, grad_d, m_d, v_d, norm_d, 1.0f, cfg, 1);

  auto grad_host = grad;
  float norm_sq = 0.0f;
  sum_squares_accumulate(f32_tensor(&norm_sq, {1}), f32_tensor(grad_host.data(), {n}), Tensor());
  adamw_step(f32_tensor(param.data(), {n}), f32_tensor(grad_host.data(), {n}), f32_tensor(m.data(), {n}),
             f32_tensor(v.data(), {n}), f32_tensor(&norm_sq, {1}), 1.0f, cfg, 1);
  EXPECT_LE(normalized_error(param_d.download(), param), kTol);
  EXPECT_LE(normalized_error(m_d.download(), m), kTol);
  EXPECT_LE(normalized_error(v_d.download(), v), kTol);
#endif
}

TEST(CudaOptim, AdamwSkipsTheStepOnANonFiniteNorm) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const int64_t n = 100003;
  const auto param = random_values(n, 1), grad = random_values(n, 2), m = random_values(n, 3, 0.1);
  auto v = random_values(n, 4, 0.1);
  for (float& x : v) x = x * x;
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    for (float max_norm : {0.0f, 1.0f}) {
      SCOPED_TRACE(::testing::Message() << "grad_norm_sq " << bad << " max_norm " << max_norm);
      DeviceBuffer param_d(DType::F32, {n}), grad_d(DType::F32, {n}), m_d(DType::F32, {n}), v_d(DType::F32, {n}),
          norm_d(DType::F32, {1});
      param_d.upload(param);
      grad_d.upload(grad);
      m_d.upload(m);
      v_d.upload(v);
      norm_d.upload({bad});
      adamw_step(param_d, grad_d, m_d, v_d, norm_d, max_norm, AdamWConfig{}, 5);
      EXPECT_TRUE(same_bits(param_d.download(), param)) << "param changed";
      EXPECT_TRUE(same_bits(m_d.download(), m)) << "m changed";
      EXPECT_TRUE(same_bits(v_d.download(), v)) << "v changed";
    }
  }
#endif
}

// The float4 path and the one-by-one path give the same bits, and the BF16 copy written in the same
// pass is exactly the rounding of the new param: views starting 0-3 elements past an aligned
// base (a head before the first 16-byte boundary, and tails of 0-3 elements) take the float4 path;
// m at another misalignment than param takes the one-by-one path. Both match the CPU op.
TEST(CudaOptim, AdamwVectorAndScalarPathsAndTheBf16CopyAgree) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const int64_t n = 100003;
  AdamWConfig cfg;
  cfg.weight_decay = 0.1f;
  const auto param0 = random_values(n, 21), grad = random_values(n, 22, 0.01);
  auto param_cpu = param0;
  std::vector<float> m_cpu(n, 0.0f), v_cpu(n, 0.0f), grad_cpu = grad;
  float norm_sq = 2.0f;
  adamw_step(f32_tensor(param_cpu.data(), {n}), f32_tensor(grad_cpu.data(), {n}), f32_tensor(m_cpu.data(), {n}),
             f32_tensor(v_cpu.data(), {n}), f32_tensor(&norm_sq, {1}), 1.0f, cfg, 1);
  std::vector<float> first_param;
  const std::pair<int64_t, int64_t> offsets[] = {{0, 0}, {1, 1}, {2, 2}, {3, 3}, {0, 1}, {2, 3}};
  for (const auto& [param_off, m_off] : offsets) {
    SCOPED_TRACE(::testing::Message() << "param offset " << param_off << ", m offset " << m_off);
    const int64_t len = n + 4;
    DeviceBuffer p_d(DType::F32, {len}), g_d(DType::F32, {len}), m_d(DType::F32, {len}), v_d(DType::F32, {len}),
        c_d(DType::BF16, {len}), norm_d(DType::F32, {1});
    auto at = [&](const DeviceBuffer& b, int64_t off) {
      return Tensor(static_cast<char*>(b.tensor().data) + off * static_cast<int64_t>(dtype_size(b.tensor().dtype)),
                    b.tensor().dtype, {n}, Device::CUDA);
    };
    auto padded = [&](const std::vector<float>& x, int64_t off) {
      std::vector<float> out(static_cast<size_t>(len), 0.0f);
      std::copy(x.begin(), x.end(), out.begin() + off);
      return out;
    };
    p_d.upload(padded(param0, param_off));
    g_d.upload(padded(grad, param_off));
    m_d.upload(std::vector<float>(static_cast<size_t>(len), 0.0f));
    v_d.upload(std::vector<float>(static_cast<size_t>(len), 0.0f));
    norm_d.upload({norm_sq});
    adamw_step(at(p_d, param_off), at(g_d, param_off), at(m_d, m_off), at(v_d, m_off), norm_d, 1.0f, cfg, 1, {}, {},
               at(c_d, param_off));
    const auto p_all = p_d.download(), c_all = c_d.download();
    const std::vector<float> p(p_all.begin() + param_off, p_all.begin() + param_off + n);
    const std::vector<float> c(c_all.begin() + param_off, c_all.begin() + param_off + n);
    EXPECT_LE(normalized_error(p, param_cpu), kTol);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(f32_to_bf16(c[static_cast<size_t>(i)]), f32_to_bf16(p[static_cast<size_t>(i)])) << "element " << i;
    // Elements around the view are untouched (the poison of the copy buffer stays).
    for (int64_t i = 0; i < param_off; ++i) EXPECT_TRUE(std::isnan(c_all[static_cast<size_t>(i)])) << i;
    for (int64_t i = param_off + n; i < len; ++i) EXPECT_TRUE(std::isnan(c_all[static_cast<size_t>(i)])) << i;
    if (first_param.empty()) first_param = p;
    else EXPECT_TRUE(same_bits(p, first_param)) << "not the bits of the aligned float4 path";
  }
#endif
}

// BF16 moments (optim.moment_dtype = "bf16"): the device gives the CPU op's bits for param, m, v
// and the BF16 param copy, on the vector path (8-byte loads and stores of 4 BF16 moments; views 0-3
// elements past an aligned base, so heads and tails of 0-3 elements) and on the one-by-one path
// (moments at another misalignment than param), over four steps: weight decay, clipping active,
// the lr and step from the host or from a schedule in device memory, and a step skipped for a NaN
// norm (nothing changes), at sizes from 1 element to several grid-strides.
TEST(CudaOptim, AdamwWithBf16MomentsGivesTheCpuOpsBitsOnBothPaths) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const std::pair<int64_t, int64_t> offsets[] = {{0, 0}, {1, 1}, {3, 3}, {0, 1}, {2, 3}};
  for (int64_t n : {int64_t{1}, int64_t{777}, int64_t{100003}, int64_t{(1 << 24) + 5}}) {
    for (const auto& [param_off, m_off] : offsets) {
      if (n > 100003 && param_off != m_off) continue;  // the one-by-one path once per size is enough
      SCOPED_TRACE(::testing::Message() << "n " << n << ", param offset " << param_off << ", m offset " << m_off);
      AdamWConfig cfg;
      cfg.weight_decay = 0.1f;
      auto param = random_values(n, 61);
      std::vector<uint16_t> m(static_cast<size_t>(n), 0), v(static_cast<size_t>(n), 0), copy(static_cast<size_t>(n));
      const int64_t len = n + 4;
      DeviceBuffer p_d(DType::F32, {len}), g_d(DType::F32, {len}), m_d(DType::BF16, {len}), v_d(DType::BF16, {len}),
          c_d(DType::BF16, {len}), norm_d(DType::F32, {1}), schedule_d(DType::F32, {2});
      auto at = [&](const DeviceBuffer& b, int64_t off) {
        return Tensor(static_cast<char*>(b.tensor().data) + off * static_cast<int64_t>(dtype_size(b.tensor().dtype)),
                      b.tensor().dtype, {n}, Device::CUDA);
      };
      auto padded = [&](const std::vector<float>& x, int64_t off) {
        std::vector<float> out(static_cast<size_t>(len), 0.0f);
        std::copy(x.begin(), x.end(), out.begin() + off);
        return out;
      };
      auto window = [&](const std::vector<float>& all, int64_t off) {
        return std::vector<float>(all.begin() + off, all.begin() + off + n);
      };
      p_d.upload(padded(param, param_off));
      m_d.upload(std::vector<float>(static_cast<size_t>(len), 0.0f));
      v_d.upload(std::vector<float>(static_cast<size_t>(len), 0.0f));
      for (int64_t step = 1; step <= 4; ++step) {
        cfg.lr = 1e-3f * static_cast<float>(step);
        auto grad = random_values(n, 70 + step, 0.5);
        float norm_sq = 0.0f;
        sum_squares_accumulate(f32_tensor(&norm_sq, {1}), f32_tensor(grad.data(), {n}), Tensor());
        if (step == 2) norm_sq = std::numeric_limits<float>::quiet_NaN();  // skipped on both
        g_d.upload(padded(grad, param_off));
        norm_d.upload({norm_sq});
        const bool use_schedule = step >= 3;
        AdamWConfig device_cfg = cfg;
        if (use_schedule) {
          schedule_d.upload({cfg.lr, static_cast<float>(step)});
          device_cfg.lr = 123.0f;  // ignored
        }
        adamw_step(f32_tensor(param.data(), {n}), f32_tensor(grad.data(), {n}),
                   Tensor(m.data(), DType::BF16, {n}), Tensor(v.data(), DType::BF16, {n}), f32_tensor(&norm_sq, {1}),
                   1.0f, cfg, step, {}, {}, Tensor(copy.data(), DType::BF16, {n}));
        adamw_step(at(p_d, param_off), at(g_d, param_off), at(m_d, m_off), at(v_d, m_off), norm_d, 1.0f, device_cfg,
                   use_schedule ? -1 : step, {}, use_schedule ? schedule_d.tensor() : Tensor(), at(c_d, param_off));
        std::vector<float> m_f(static_cast<size_t>(n)), v_f(static_cast<size_t>(n)), c_f(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          m_f[static_cast<size_t>(i)] = bf16_to_f32(m[static_cast<size_t>(i)]);
          v_f[static_cast<size_t>(i)] = bf16_to_f32(v[static_cast<size_t>(i)]);
          c_f[static_cast<size_t>(i)] = bf16_to_f32(copy[static_cast<size_t>(i)]);
        }
        EXPECT_TRUE(same_bits(window(p_d.download(), param_off), param)) << "param, step " << step;
        EXPECT_TRUE(same_bits(window(m_d.download(), m_off), m_f)) << "exp_avg, step " << step;
        EXPECT_TRUE(same_bits(window(v_d.download(), m_off), v_f)) << "exp_avg_sq, step " << step;
        EXPECT_TRUE(same_bits(window(c_d.download(), param_off), c_f)) << "param_bf16, step " << step;
      }
      // The moments around the views are untouched (zeros as uploaded).
      const auto m_all = m_d.download();
      for (int64_t i = 0; i < m_off; ++i) EXPECT_EQ(m_all[static_cast<size_t>(i)], 0.0f) << i;
      for (int64_t i = m_off + n; i < len; ++i) EXPECT_EQ(m_all[static_cast<size_t>(i)], 0.0f) << i;
    }
  }
#endif
}

TEST(CudaOptim, RejectsNonF32AndMismatchedShapes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer p(DType::F32, {8}), p_bf16(DType::BF16, {8}), g7(DType::F32, {7}), norm(DType::F32, {1}),
      out2(DType::F32, {2}), ws(DType::F32, {sum_squares_workspace_elems(Device::CUDA, 8)});
  EXPECT_THROW(sum_squares_accumulate(norm, p_bf16, ws), Error);
  EXPECT_THROW(sum_squares_accumulate(out2, p, ws), Error);
  EXPECT_THROW(adamw_step(p, g7, p, p, norm, 1.0f, AdamWConfig{}, 1), Error);
  EXPECT_THROW(adamw_step(p_bf16, p_bf16, p_bf16, p_bf16, norm, 1.0f, AdamWConfig{}, 1), Error);
  EXPECT_THROW(adamw_step(p, p, p_bf16, p, norm, 1.0f, AdamWConfig{}, 1), Error);  // moments of two dtypes
  EXPECT_NO_THROW(adamw_step(p, p, p_bf16, p_bf16, norm, 1.0f, AdamWConfig{}, 1));
  EXPECT_THROW(adamw_step(p, p, p, p, norm, 1.0f, AdamWConfig{}, 0), Error);
#endif
}

#if defined(MOE_HAVE_CUDA)
// One AdamW update on the device from (param0, m0, v0): without a schedule (cfg.lr, step) when
// schedule_d is null, else from schedule_d = {lr, step} with cfg.lr and `step` set to nonsense.
struct DeviceAdamW {
  int64_t n;
  DeviceBuffer param_d{DType::F32, {n}}, grad_d{DType::F32, {n}}, m_d{DType::F32, {n}}, v_d{DType::F32, {n}},
      norm_d{DType::F32, {1}}, schedule_d{DType::F32, {2}};

  void load(const std::vector<float>& param, const std::vector<float>& grad, const std::vector<float>& m,
            const std::vector<float>& v, float norm_sq) {
    param_d.upload(param);
    grad_d.upload(grad);
    m_d.upload(m);
    v_d.upload(v);
    norm_d.upload({norm_sq});
  }
  void step(AdamWConfig cfg, float max_norm, int64_t step, bool use_schedule) {
    if (!use_schedule) return adamw_step(param_d, grad_d, m_d, v_d, norm_d, max_norm, cfg, step);
    schedule_d.upload({cfg.lr, static_cast<float>(step)});
    cfg.lr = 123.0f;  // ignored
    adamw_step(param_d, grad_d, m_d, v_d, norm_d, max_norm, cfg, /*step=*/-5, {}, schedule_d);
  }
};
#endif

// The device computes the bias corrections and decay from the schedule in memory with the same
// double arithmetic as the host: steps 1 to 2000, each from the same state with its own lr, give
// the same param/m/v bits with and without a schedule (weight decay on, clipping active; n spans
// four blocks, each of which computes the scalars itself).
TEST(CudaOptim, AdamwWithScheduleEqualsAdamwWithoutOverTwoThousandSteps) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const int64_t n = 1000;
  const auto param = random_values(n, 21), grad = random_values(n, 22, 0.5), m = random_values(n, 23, 0.1);
  auto v = random_values(n, 24, 0.1);
  for (float& x : v) x = x * x;
  auto grad_host = grad;
  float norm_sq = 0.0f;
  sum_squares_accumulate(f32_tensor(&norm_sq, {1}), f32_tensor(grad_host.data(), {n}), Tensor());
  AdamWConfig cfg;
  cfg.weight_decay = 0.1f;
  DeviceAdamW plain{n}, scheduled{n};
  int mismatched_steps = 0;
  for (int64_t step = 1; step <= 2000; ++step) {
    cfg.lr = 3e-4f * static_cast<float>(0.05 + 0.95 * static_cast<double>((step * 37) % 101) / 100.0);
    plain.load(param, grad, m, v, norm_sq);
    scheduled.load(param, grad, m, v, norm_sq);
    plain.step(cfg, 1.0f, step, false);
    scheduled.step(cfg, 1.0f, step, true);
    const bool same = same_bits(plain.param_d.download(), scheduled.param_d.download()) &&
                      same_bits(plain.m_d.download(), scheduled.m_d.download()) &&
                      same_bits(plain.v_d.download(), scheduled.v_d.download());
    if (!same && ++mismatched_steps <= 5) ADD_FAILURE() << "step " << step << " lr " << cfg.lr << " differs";
  }
  EXPECT_EQ(mismatched_steps, 0);
#endif
}

// Three consecutive steps with a warmup lr on 100003 elements (many blocks), clipping active,
// inactive and off: the schedule run equals the plain run bit for bit, and both track the CPU.
TEST(CudaOptim, AdamwWithScheduleEqualsAdamwWithoutOverThreeSteps) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const int64_t n = 100003;
  for (float max_norm : {1.0f, 1e6f, 0.0f}) {
    SCOPED_TRACE(::testing::Message() << "max_norm " << max_norm);
    AdamWConfig cfg;
    cfg.weight_decay = 0.05f;
    auto param = random_values(n, 31);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    DeviceAdamW plain{n}, scheduled{n};
    for (int64_t step = 1; step <= 3; ++step) {
      cfg.lr = 1e-3f * static_cast<float>(step) / 3.0f;
      auto grad = random_values(n, 40 + step, 0.01);
      float norm_sq = 0.0f;
      sum_squares_accumulate(f32_tensor(&norm_sq, {1}), f32_tensor(grad.data(), {n}), Tensor());
      if (step == 1) {
        plain.load(param, grad, m, v, norm_sq);
        scheduled.load(param, grad, m, v, norm_sq);
      } else {
        for (DeviceAdamW* d : {&plain, &scheduled}) {
          d->grad_d.upload(grad);
          d->norm_d.upload({norm_sq});
        }
      }
      adamw_step(f32_tensor(param.data(), {n}), f32_tensor(grad.data(), {n}), f32_tensor(m.data(), {n}),
                 f32_tensor(v.data(), {n}), f32_tensor(&norm_sq, {1}), max_norm, cfg, step);
      plain.step(cfg, max_norm, step, false);
      scheduled.step(cfg, max_norm, step, true);
      const auto got = scheduled.param_d.download();
      EXPECT_TRUE(same_bits(got, plain.param_d.download())) << "param, step " << step;
      EXPECT_TRUE(same_bits(scheduled.m_d.download(), plain.m_d.download())) << "m, step " << step;
      EXPECT_TRUE(same_bits(scheduled.v_d.download(), plain.v_d.download())) << "v, step " << step;
      EXPECT_LE(normalized_error(got, param), kTol) << "param against the CPU, step " << step;
    }
  }
#endif
}

// The reason for the schedule: one captured update replays with a new lr and step written into
// device memory before each replay, and gives the bits of plain (uncaptured) steps.
TEST(CudaOptim, AdamwScheduleReplaysInACapturedGraph) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const int64_t n = 100003;
  AdamWConfig cfg;
  cfg.weight_decay = 0.1f;
  const auto param = random_values(n, 51), grad = random_values(n, 52, 0.01);
  const std::vector<float> zeros(n, 0.0f);
  auto grad_host = grad;
  float norm_sq = 0.0f;
  sum_squares_accumulate(f32_tensor(&norm_sq, {1}), f32_tensor(grad_host.data(), {n}), Tensor());
  DeviceAdamW plain{n}, graphed{n};
  plain.load(param, grad, zeros, zeros, norm_sq);
  graphed.load(param, grad, zeros, zeros, norm_sq);

  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  adamw_step(graphed.param_d, graphed.grad_d, graphed.m_d, graphed.v_d, graphed.norm_d, 1.0f, cfg, 1, Stream{s},
             graphed.schedule_d);
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int64_t step = 1; step <= 3; ++step) {
    cfg.lr = 1e-3f / static_cast<float>(step);
    graphed.schedule_d.upload({cfg.lr, static_cast<float>(step)});
    CUDA_CHECK(cudaDeviceSynchronize());  // s does not wait for the legacy stream's copies by itself
    CUDA_CHECK(cudaGraphLaunch(exec, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    plain.step(cfg, 1.0f, step, false);
    EXPECT_TRUE(same_bits(graphed.param_d.download(), plain.param_d.download())) << "param, step " << step;
    EXPECT_TRUE(same_bits(graphed.m_d.download(), plain.m_d.download())) << "m, step " << step;
    EXPECT_TRUE(same_bits(graphed.v_d.download(), plain.v_d.download())) << "v, step " << step;
  }
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(s));
#endif
}

TEST(CudaOptim, AdamwRejectsAScheduleOffTheDeviceOrOfAnotherShape) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer p(DType::F32, {8}), norm(DType::F32, {1}), schedule3(DType::F32, {3}), schedule_i32(DType::I32, {2});
  float schedule_host[2] = {1e-3f, 1.0f};
  EXPECT_THROW(adamw_step(p, p, p, p, norm, 1.0f, AdamWConfig{}, 1, {}, f32_tensor(schedule_host, {2})), Error);
  EXPECT_THROW(adamw_step(p, p, p, p, norm, 1.0f, AdamWConfig{}, 1, {}, schedule3), Error);
  EXPECT_THROW(adamw_step(p, p, p, p, norm, 1.0f, AdamWConfig{}, 1, {}, schedule_i32), Error);
#endif
}

}  // namespace
}  // namespace moe

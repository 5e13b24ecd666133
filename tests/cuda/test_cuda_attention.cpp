// cuda::attention_forward/backward (cuDNN SDPA) against the CPU op on the same BF16-rounded
// inputs: multi-head and grouped-query shapes, sequence lengths that are not multiples of any
// tile, one long sequence; outputs start poisoned (NaN) so every element must be written; the
// forward is bitwise repeatable; F32 tensors are refused.
// Tolerances: out, dq, dk, dv (BF16 outputs of FP32 math) normalized error ||gpu - cpu|| / ||cpu||
// <= 2e-2; lse (F32) max |gpu - cpu| <= 1e-3 (both are FP32 sums of the same BF16 products).
// The CPU backward runs on its own F32 out/lse, the GPU backward on the GPU's BF16 out and its lse.
// MOE_ATTENTION_BENCH=1 also times B=8, T=4096, Hq=Hkv=16, hd=128 (CUDA events, median of 20).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "moe/ops/attention.h"
#if defined(MOE_HAVE_CUDA)
#include "moe/ops/cuda/attention.h"
#endif

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
constexpr double kTolBf16 = 2e-2;
constexpr double kTolLse = 1e-3;

// Skips when the binary was built without cuDNN attention (CMake found no cuDNN frontend).
#define MOE_SKIP_WITHOUT_CUDNN()                                                \
  do {                                                                          \
    std::string moe_why_;                                                       \
    if (!::moe::cuda::attention_supported(&moe_why_)) GTEST_SKIP() << moe_why_; \
  } while (0)

using testing::DeviceBuffer;

std::vector<float> random_bf16_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return testing::round_bf16(v);
}

std::string str(const AttentionShape& s) {
  std::ostringstream os;
  os << "B=" << s.batch << " T=" << s.seq_len << " Hq=" << s.n_heads << " Hkv=" << s.n_kv_heads
     << " hd=" << s.head_dim << (s.deterministic ? " deterministic" : "");
  return os.str();
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return m;
}

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// Device tensors of one problem, every output poisoned by DeviceBuffer.
struct DeviceProblem {
  AttentionShape s;
  int64_t rows, q_width, kv_width;
  DeviceBuffer q, k, v, out, lse, dout, dq, dk, dv, workspace;
  explicit DeviceProblem(const AttentionShape& shape)
      : s(shape),
        rows(shape.batch * shape.seq_len),
        q_width(shape.n_heads * shape.head_dim),
        kv_width(shape.n_kv_heads * shape.head_dim),
        q(DType::BF16, {rows, q_width}),
        k(DType::BF16, {rows, kv_width}),
        v(DType::BF16, {rows, kv_width}),
        out(DType::BF16, {rows, q_width}),
        lse(DType::F32, {shape.batch, shape.n_heads, shape.seq_len}),
        dout(DType::BF16, {rows, q_width}),
        dq(DType::BF16, {rows, q_width}),
        dk(DType::BF16, {rows, kv_width}),
        dv(DType::BF16, {rows, kv_width}),
        workspace(DType::F32, {std::max<int64_t>(1, attention_workspace_elems(shape))}) {}
  void forward(Stream stream = {}) { attention_forward(out, lse, q, k, v, s, workspace, stream); }
  void backward(Stream stream = {}) { attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s, workspace, stream); }
};

void expect_matches_cpu(const AttentionShape& s, uint32_t seed) {
  SCOPED_TRACE(str(s));
  DeviceProblem d(s);
  const std::vector<float> q = random_bf16_values(d.rows * d.q_width, seed);
  const std::vector<float> k = random_bf16_values(d.rows * d.kv_width, seed + 1);
  const std::vector<float> v = random_bf16_values(d.rows * d.kv_width, seed + 2);
  const std::vector<float> dout = random_bf16_values(d.rows * d.q_width, seed + 3);
  d.q.upload(q);
  d.k.upload(k);
  d.v.upload(v);
  d.dout.upload(dout);
  d.forward();
  d.backward();

  // CPU reference on the same (BF16-valued) inputs in F32.
  std::vector<float> ws(static_cast<size_t>(attention_workspace_elems(s)));
  std::vector<float> out(q.size()), lse(static_cast<size_t>(s.batch * s.n_heads * s.seq_len));
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  auto cpu = [](const std::vector<float>& x, int64_t rows, int64_t width) {
    return f32_tensor(const_cast<float*>(x.data()), {rows, width});
  };
  const Tensor cpu_ws = f32_tensor(ws.data(), {static_cast<int64_t>(ws.size())});
  attention_forward(cpu(out, d.rows, d.q_width), f32_tensor(lse.data(), {s.batch, s.n_heads, s.seq_len}),
                    cpu(q, d.rows, d.q_width), cpu(k, d.rows, d.kv_width), cpu(v, d.rows, d.kv_width), s, cpu_ws);
  attention_backward(cpu(dq, d.rows, d.q_width), cpu(dk, d.rows, d.kv_width), cpu(dv, d.rows, d.kv_width),
                     cpu(dout, d.rows, d.q_width), cpu(q, d.rows, d.q_width), cpu(k, d.rows, d.kv_width),
                     cpu(v, d.rows, d.kv_width), cpu(out, d.rows, d.q_width),
                     f32_tensor(lse.data(), {s.batch, s.n_heads, s.seq_len}), s, cpu_ws);

  const std::vector<float> g_out = d.out.download(), g_lse = d.lse.download(), g_dq = d.dq.download(),
                           g_dk = d.dk.download(), g_dv = d.dv.download();
  // Poison (NaN) left anywhere means an element was not written.
  EXPECT_TRUE(all_finite(g_out) && all_finite(g_lse) && all_finite(g_dq) && all_finite(g_dk) && all_finite(g_dv));
  const double e_out = testing::normalized_error(g_out, out), e_lse = max_abs_diff(g_lse, lse),
               e_dq = testing::normalized_error(g_dq, dq), e_dk = testing::normalized_error(g_dk, dk),
               e_dv = testing::normalized_error(g_dv, dv);
  std::printf("[ attention ] %s: out %.2e, lse max|diff| %.2e, dq %.2e, dk %.2e, dv %.2e\n", str(s).c_str(), e_out,
              e_lse, e_dq, e_dk, e_dv);
  EXPECT_LE(e_out, kTolBf16);
  EXPECT_LE(e_lse, kTolLse);
  EXPECT_LE(e_dq, kTolBf16);
  EXPECT_LE(e_dk, kTolBf16);
  EXPECT_LE(e_dv, kTolBf16);
}
#endif

TEST(CudaAttention, MultiHeadMatchesCpu) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  MOE_SKIP_WITHOUT_CUDNN();
  expect_matches_cpu({2, 128, 4, 4, 64}, 1);
  expect_matches_cpu({2, 64, 16, 16, 128}, 2);
#endif
}

TEST(CudaAttention, GroupedQueryHeadsWithUntiledLengthMatchCpu) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  MOE_SKIP_WITHOUT_CUDNN();
  expect_matches_cpu({1, 300, 8, 2, 128}, 3);  // 300: no multiple of 64 or 128; 4 query heads per kv head
#endif
}

TEST(CudaAttention, LongSequenceMatchesCpu) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  MOE_SKIP_WITHOUT_CUDNN();
  expect_matches_cpu({1, 4096, 16, 16, 128}, 4);
#endif
}

TEST(CudaAttention, ForwardIsBitwiseRepeatable) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  MOE_SKIP_WITHOUT_CUDNN();
  const AttentionShape s{1, 300, 8, 2, 128};
  DeviceProblem d(s);
  d.q.upload(random_bf16_values(d.rows * d.q_width, 5));
  d.k.upload(random_bf16_values(d.rows * d.kv_width, 6));
  d.v.upload(random_bf16_values(d.rows * d.kv_width, 7));
  d.forward();
  const std::vector<float> out1 = d.out.download(), lse1 = d.lse.download();
  CUDA_CHECK(cudaMemset(d.out.tensor().data, 0xff, d.out.bytes()));
  CUDA_CHECK(cudaMemset(d.lse.tensor().data, 0xff, d.lse.bytes()));
  d.forward();
  const std::vector<float> out2 = d.out.download(), lse2 = d.lse.download();
  EXPECT_EQ(std::memcmp(out1.data(), out2.data(), out1.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(lse1.data(), lse2.data(), lse1.size() * sizeof(float)), 0);
#endif
}

// AttentionShape::deterministic: cuDNN's deterministic backward matches the CPU op like the
// default one, and a second backward over the same inputs gives the same bits (the default
// algorithm accumulates dQ with atomics and need not).
TEST(CudaAttention, DeterministicBackwardMatchesCpuAndRepeatsBitForBit) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  MOE_SKIP_WITHOUT_CUDNN();
  AttentionShape s{2, 300, 8, 2, 128};
  s.deterministic = true;
  expect_matches_cpu(s, 8);
  DeviceProblem d(s);
  d.q.upload(random_bf16_values(d.rows * d.q_width, 9));
  d.k.upload(random_bf16_values(d.rows * d.kv_width, 10));
  d.v.upload(random_bf16_values(d.rows * d.kv_width, 11));
  d.dout.upload(random_bf16_values(d.rows * d.q_width, 12));
  d.forward();
  d.backward();
  const std::vector<float> dq1 = d.dq.download(), dk1 = d.dk.download(), dv1 = d.dv.download();
  for (DeviceBuffer* b : {&d.dq, &d.dk, &d.dv}) CUDA_CHECK(cudaMemset(b->tensor().data, 0xff, b->bytes()));
  d.backward();
  EXPECT_EQ(d.dq.download(), dq1);
  EXPECT_EQ(d.dk.download(), dk1);
  EXPECT_EQ(d.dv.download(), dv1);
  // The memory plan reserves attention_deterministic_workspace_bytes for this algorithm (the dP
  // buffer) beyond the library reserve, which holds the default's workspace: cuDNN's own figure
  // must not pass the two together (printed, to see how close the plan is).
  AttentionShape plain = s;
  plain.deterministic = false;
  const int64_t planned = attention_deterministic_workspace_bytes(s);
  const int64_t det_ws = ::moe::cuda::attention_workspace_bytes(s, true, {});
  const int64_t default_ws = ::moe::cuda::attention_workspace_bytes(plain, true, {});
  std::printf("[ attention ] %s: backward workspace %lld bytes (default algorithm %lld), planned %lld\n",
              str(s).c_str(), static_cast<long long>(det_ws), static_cast<long long>(default_ws),
              static_cast<long long>(planned));
  EXPECT_LE(det_ws, planned + default_ws);
#endif
}

TEST(CudaAttention, F32TensorsAreRefused) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  MOE_SKIP_WITHOUT_CUDNN();
  const AttentionShape s{1, 16, 2, 2, 64};
  DeviceBuffer q(DType::F32, {16, 128}), k(DType::F32, {16, 128}), v(DType::F32, {16, 128}),
      out(DType::F32, {16, 128}), lse(DType::F32, {1, 2, 16}), ws(DType::F32, {1});
  try {
    attention_forward(out, lse, q, k, v, s, ws);
    ADD_FAILURE() << "F32 q was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be BF16"), std::string::npos) << e.what();
  }
#endif
}

// Timing of the bench shape, on request: forward, backward and forward + backward.
TEST(CudaAttention, BenchShapeTiming) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  MOE_SKIP_WITHOUT_CUDNN();
  const char* env = std::getenv("MOE_ATTENTION_BENCH");
  if (env == nullptr || std::string(env) != "1") GTEST_SKIP() << "set MOE_ATTENTION_BENCH=1 to time";
  const AttentionShape s{8, 4096, 16, 16, 128};
  DeviceProblem d(s);
  d.q.upload(random_bf16_values(d.rows * d.q_width, 8));
  d.k.upload(random_bf16_values(d.rows * d.kv_width, 9));
  d.v.upload(random_bf16_values(d.rows * d.kv_width, 10));
  d.dout.upload(random_bf16_values(d.rows * d.q_width, 11));
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  auto median_ms = [&](auto&& body) {
    for (int i = 0; i < 3; ++i) body();
    std::vector<float> ms(20);
    for (float& m : ms) {
      CUDA_CHECK(cudaEventRecord(start));
      body();
      CUDA_CHECK(cudaEventRecord(stop));
      CUDA_CHECK(cudaEventSynchronize(stop));
      CUDA_CHECK(cudaEventElapsedTime(&m, start, stop));
    }
    std::sort(ms.begin(), ms.end());
    return 0.5 * (ms[9] + ms[10]);
  };
  const double fwd = median_ms([&] { d.forward(); });
  const double bwd = median_ms([&] { d.backward(); });
  const double both = median_ms([&] {
    d.forward();
    d.backward();
  });
  // Causal forward FLOPs: 2 matmuls x 2 x B x H x T^2 x hd, halved by the mask.
  const double fwd_flops = 2.0 * s.batch * s.n_heads * double(s.seq_len) * s.seq_len * s.head_dim;
  std::printf("[ attention ] %s BF16: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms, forward+backward %.3f ms\n",
              str(s).c_str(), fwd, fwd_flops / (fwd * 1e9), bwd, both);
  EXPECT_TRUE(all_finite(d.dq.download()));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
#endif
}

}  // namespace
}  // namespace moe

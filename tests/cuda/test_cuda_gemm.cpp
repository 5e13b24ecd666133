// cuda::matmul (cuBLASLt) against the CPU matmul on fresh random inputs: odd shapes, one row, a
// large product, every transpose, alpha/beta, BF16 inputs with BF16 or F32 output, folded leading
// dims, unaligned sub-views, leading dims wider than the rows, K = 0, graph capture.
// Tolerances (normalized error ||gpu - cpu|| / ||cpu||): F32 <= 1e-5 (CUBLAS_COMPUTE_32F, no TF32);
// BF16 inputs (rounded to BF16 before the CPU reference) <= 1e-2 (BF16 output rounding dominates).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include "cuda_test_util.h"
#include "moe/ops/gemm.h"
#if defined(MOE_HAVE_CUDA)
#include "moe/ops/cuda/gemm.h"
#endif

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
constexpr double kTolF32 = 1e-5;
constexpr double kTolBf16 = 1e-2;

std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

using testing::DeviceBuffer;

struct GemmCase {
  int64_t M, N, K;
  bool trans_a, trans_b;
  float alpha, beta;
  DType in, out;
  std::string str() const {
    std::ostringstream os;
    os << "M=" << M << " N=" << N << " K=" << K << " trans_a=" << trans_a << " trans_b=" << trans_b
       << " alpha=" << alpha << " beta=" << beta << " in=" << dtype_name(in) << " out=" << dtype_name(out);
    return os.str();
  }
};

// Runs one case on both devices; beta = 0 leaves the GPU's c poisoned (NaN) to prove it is not read.
void expect_matches_cpu(const GemmCase& g, uint32_t seed) {
  const int64_t a_rows = g.trans_a ? g.K : g.M, a_cols = g.trans_a ? g.M : g.K;
  const int64_t b_rows = g.trans_b ? g.N : g.K, b_cols = g.trans_b ? g.K : g.N;
  const Shape a_shape{a_rows, a_cols};
  const Shape b_shape{b_rows, b_cols};
  std::vector<float> a = random_values(a_shape.numel(), seed);
  std::vector<float> b = random_values(b_shape.numel(), seed + 1);
  std::vector<float> c0 = random_values(g.M * g.N, seed + 2);
  if (g.in == DType::BF16) {
    a = testing::round_bf16(a);
    b = testing::round_bf16(b);
  }
  if (g.out == DType::BF16) c0 = testing::round_bf16(c0);
  std::vector<float> ref = c0;
  matmul(f32_tensor(ref.data(), {g.M, g.N}), f32_tensor(a.data(), a_shape), f32_tensor(b.data(), b_shape), g.trans_a,
         g.trans_b, g.alpha, g.beta);

  DeviceBuffer da(g.in, a_shape), db(g.in, b_shape), dc(g.out, {g.M, g.N});
  da.upload(a);
  db.upload(b);
  if (g.beta != 0.0f) dc.upload(c0);
  matmul(dc, da, db, g.trans_a, g.trans_b, g.alpha, g.beta);
  const double err = testing::normalized_error(dc.download(), ref);
  EXPECT_LE(err, g.in == DType::F32 ? kTolF32 : kTolBf16) << g.str();
}

const std::vector<std::array<int64_t, 3>> kShapes = {{1, 1, 1}, {1, 37, 19}, {17, 33, 65}, {129, 255, 63},
                                                     {1024, 2048, 512}};
const std::vector<std::pair<float, float>> kAlphaBeta = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.25f, 0.75f}};

void sweep(DType in, DType out) {
  uint32_t seed = 100;
  for (const auto& s : kShapes)
    for (int t = 0; t < 4; ++t)
      for (const auto& [alpha, beta] : kAlphaBeta)
        expect_matches_cpu({s[0], s[1], s[2], (t & 1) != 0, (t & 2) != 0, alpha, beta, in, out}, seed += 3);
}
#endif

TEST(CudaGemm, F32MatchesCpuForEveryTransposeAndScale) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  sweep(DType::F32, DType::F32);
#endif
}

TEST(CudaGemm, Bf16InputsWithBf16OutputMatchCpu) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  sweep(DType::BF16, DType::BF16);
#endif
}

TEST(CudaGemm, Bf16InputsAccumulateIntoF32Output) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  sweep(DType::BF16, DType::F32);
#endif
}

TEST(CudaGemm, LeadingDimsFoldIntoRows) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  // x [2, 3, 5, K] times W^T with W [N, K] -> y [2, 3, 5, N], as a linear layer does.
  const int64_t K = 24, N = 13;
  std::vector<float> x = random_values(2 * 3 * 5 * K, 7), w = random_values(N * K, 8);
  std::vector<float> ref(2 * 3 * 5 * N);
  matmul(f32_tensor(ref.data(), {2, 3, 5, N}), f32_tensor(x.data(), {2, 3, 5, K}), f32_tensor(w.data(), {N, K}),
         false, true, 1.0f, 0.0f);
  DeviceBuffer dx(DType::F32, {2, 3, 5, K}), dw(DType::F32, {N, K}), dy(DType::F32, {2, 3, 5, N});
  dx.upload(x);
  dw.upload(w);
  matmul(dy, dx, dw, false, true, 1.0f, 0.0f);
  EXPECT_LE(testing::normalized_error(dy.download(), ref), kTolF32);
#endif
}

TEST(CudaGemm, EmptyInnerDimensionScalesC) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  for (DType out : {DType::F32, DType::BF16}) {
    const DType in = out;
    DeviceBuffer a(in, {5, 0}), b(in, {0, 7}), c(out, {5, 7});
    // beta = 0 over the NaN poison writes zeros.
    matmul(c, a, b, false, false, 1.0f, 0.0f);
    for (float v : c.download()) ASSERT_EQ(v, 0.0f);
    std::vector<float> c0 = testing::round_bf16(random_values(35, 9));
    c.upload(c0);
    matmul(c, a, b, false, false, 1.0f, 0.5f);
    const std::vector<float> got = c.download();
    for (size_t i = 0; i < c0.size(); ++i) ASSERT_EQ(got[i], 0.5f * c0[i]) << i;  // exact: halving
  }
#endif
}

TEST(CudaGemm, EmptyOutputDoesNothing) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer a(DType::F32, {0, 4}), b(DType::F32, {4, 6}), c(DType::F32, {0, 6});
  EXPECT_NO_THROW(matmul(c, a, b, false, false, 1.0f, 0.0f));
  DeviceBuffer a2(DType::F32, {3, 4}), b2(DType::F32, {4, 0}), c2(DType::F32, {3, 0});
  EXPECT_NO_THROW(matmul(c2, a2, b2, false, false, 1.0f, 0.0f));
  CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

TEST(CudaGemm, UnalignedRowSubviewsMatchCpu) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  // Views starting one row into odd-width buffers: pointers aligned to 2 (BF16) or 4 (F32) bytes only.
  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t M = 33, N = 41, K = 27;
    std::vector<float> a = testing::round_bf16(random_values((M + 1) * K, 11));
    std::vector<float> b = testing::round_bf16(random_values((K + 1) * N, 12));
    std::vector<float> ref((M + 1) * N, 0.0f);
    matmul(f32_tensor(ref.data() + N, {M, N}), f32_tensor(a.data() + K, {M, K}), f32_tensor(b.data() + N, {K, N}),
           false, false, 1.0f, 0.0f);
    DeviceBuffer da(dt, {M + 1, K}), db(dt, {K + 1, N}), dc(dt, {M + 1, N});
    da.upload(a);
    db.upload(b);
    matmul(dc.tensor().rows(1, M + 1), da.tensor().rows(1, M + 1), db.tensor().rows(1, K + 1), false, false, 1.0f,
           0.0f);
    std::vector<float> got = dc.download();
    EXPECT_TRUE(std::isnan(got[0])) << "row 0 of c lies outside the view and must stay untouched";
    got.erase(got.begin(), got.begin() + N);
    ref.erase(ref.begin(), ref.begin() + N);
    EXPECT_LE(testing::normalized_error(got, ref), dt == DType::F32 ? kTolF32 : kTolBf16) << dtype_name(dt);
  }
#endif
}

TEST(CudaGemm, MatrixViewWithWideLeadingDimMatchesCpu) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  // a [M, K] stored in rows of 2K elements (as the LM head's BF16 gradient is), op(a)^T products too.
  const int64_t M = 19, N = 23, K = 37;
  std::vector<float> a_dense = testing::round_bf16(random_values(M * K, 21));
  std::vector<float> b = testing::round_bf16(random_values(M * N, 22));
  std::vector<float> a_wide(M * 2 * K, 1e30f);  // the padding must never be read into the result
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < K; ++k) a_wide[r * 2 * K + k] = a_dense[r * K + k];
  // c [K, N] = a^T b
  std::vector<float> ref(K * N);
  matmul(f32_tensor(ref.data(), {K, N}), f32_tensor(a_dense.data(), {M, K}), f32_tensor(b.data(), {M, N}), true,
         false, 1.0f, 0.0f);
  DeviceBuffer da(DType::BF16, {M, 2 * K}), db(DType::BF16, {M, N}), dc(DType::F32, {K, N});
  da.upload(a_wide);
  db.upload(b);
  cuda::matmul_view({dc.tensor().data, DType::F32, K, N, N}, {da.tensor().data, DType::BF16, M, K, 2 * K},
                    {db.tensor().data, DType::BF16, M, N, N}, true, false, 1.0f, 0.0f, Stream{});
  EXPECT_LE(testing::normalized_error(dc.download(), ref), kTolF32);
#endif
}

TEST(CudaGemm, RepeatedCallsAreDeterministicAndReuseThePlan) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const int64_t M = 300, N = 200, K = 150;
  DeviceBuffer a(DType::BF16, {M, K}), b(DType::BF16, {N, K}), c1(DType::F32, {M, N}), c2(DType::F32, {M, N});
  a.upload(random_values(M * K, 31));
  b.upload(random_values(N * K, 32));
  matmul(c1, a, b, false, true, 1.0f, 0.0f);
  expect_matches_cpu({7, 9, 11, false, false, 1.0f, 0.0f, DType::BF16, DType::F32}, 33);  // another plan between
  matmul(c2, a, b, false, true, 1.0f, 0.0f);
  EXPECT_EQ(c1.download(), c2.download());
#endif
}

TEST(CudaGemm, ReplaysInsideACapturedGraph) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const int64_t M = 64, N = 96, K = 80;
  std::vector<float> a = random_values(M * K, 41), b = random_values(K * N, 42);
  std::vector<float> ref(M * N);
  matmul(f32_tensor(ref.data(), {M, N}), f32_tensor(a.data(), {M, K}), f32_tensor(b.data(), {K, N}), false, false,
         1.0f, 0.0f);
  DeviceBuffer da(DType::F32, {M, K}), db(DType::F32, {K, N}), dc(DType::F32, {M, N});
  da.upload(a);
  db.upload(b);
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const Stream stream{s};
  matmul(dc, da, db, false, false, 1.0f, 0.0f, stream);  // eager first call: handle, workspace, plan
  CUDA_CHECK(cudaStreamSynchronize(s));
  CUDA_CHECK(cudaMemset(dc.tensor().data, 0xff, dc.bytes()));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  matmul(dc, da, db, false, false, 1.0f, 0.0f, stream);
  CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphLaunch(exec, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_LE(testing::normalized_error(dc.download(), ref), kTolF32);
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(s));
#endif
}

TEST(CudaGemm, MismatchedDtypesAreRefused) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer a32(DType::F32, {4, 4}), b16(DType::BF16, {4, 4}), c32(DType::F32, {4, 4}), c16(DType::BF16, {4, 4});
  EXPECT_THROW(matmul(c32, a32, b16, false, false, 1.0f, 0.0f), Error);
  EXPECT_THROW(matmul(c16, a32, a32, false, false, 1.0f, 0.0f), Error);  // F32 inputs need an F32 output
#endif
}

}  // namespace
}  // namespace moe

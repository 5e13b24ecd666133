// cuda::grouped_matmul / grouped_matmul_wgrad against the CPU ops on fresh random inputs, with the
// per-expert offsets only on the device: E in {1, 8, 64}, experts with zero rows, rows before
// offsets[0] and past offsets[E] untouched (poisoned c stays NaN; NaN a rows there are never read),
// trans_b both ways, accumulate, BF16 inputs with BF16 or F32 output.
// The odd dims (67 x 45) run the tiled kernels; the multiple-of-8 dims run CUTLASS's grouped GEMM
// where it is built in (BF16 -> BF16 products, BF16 -> F32 wgrad), including the model's shapes at
// small scale, and a CUDA graph that captures all three products and is replayed with new offsets.
// Tolerances (normalized error over the rows the op writes): F32 <= 1e-5; BF16 inputs (rounded to
// BF16 before the CPU reference) <= 1e-2 (BF16 output rounding alone gives ~2e-3), and <= 1e-5 for
// the BF16 -> F32 wgrad on CUTLASS (exact products, FP32 sums). Untouched rows and zero-row experts
// must be bit-exact.
// MOE_BENCH=1 also runs the timing test: the bench-olmoe-4l expert shapes and the MoE-layer sweep,
// CUTLASS against the tiled kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "moe/ops/grouped_gemm.h"
#if defined(MOE_HAVE_CUDA)
#include "moe/ops/cuda/grouped_gemm.h"
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

bool same_bits(float x, float y) { return std::memcmp(&x, &y, sizeof(float)) == 0; }

struct Layout {
  std::vector<int32_t> offsets;  // [E+1]
  int64_t rows = 0;              // buffer rows (capacity), > offsets[E]
};

// counts per expert, `lead` unused rows before expert 0 and `tail` after the last expert.
Layout make_layout(const std::vector<int32_t>& counts, int32_t lead, int32_t tail) {
  Layout l;
  l.offsets.push_back(lead);
  for (int32_t c : counts) l.offsets.push_back(l.offsets.back() + c);
  l.rows = l.offsets.back() + tail;
  return l;
}

std::vector<int32_t> random_counts(int E, int max_count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, max_count);
  std::vector<int32_t> counts(E);
  for (int e = 0; e < E; ++e) counts[e] = (e % 5 == 2) ? 0 : dist(rng);  // every fifth expert empty
  return counts;
}

// Random values in rows [o_0, o_E) of a [rows, cols] buffer, NaN elsewhere (must never be read).
std::vector<float> routed_rows(const Layout& l, int64_t cols, uint32_t seed, bool bf16) {
  std::vector<float> v = random_values(l.rows * cols, seed);
  if (bf16) v = testing::round_bf16(v);
  const int64_t first = l.offsets.front(), last = l.offsets.back();
  for (int64_t r = 0; r < l.rows; ++r)
    if (r < first || r >= last)
      for (int64_t j = 0; j < cols; ++j) v[r * cols + j] = NAN;
  return v;
}

using testing::DeviceBuffer;
using testing::time_ms;

double expect_grouped_matmul_matches_cpu(const Layout& l, int64_t k_in, int64_t n_out, bool trans_b, bool accumulate,
                                         DType in, DType out, uint32_t seed) {
  const int64_t E = static_cast<int64_t>(l.offsets.size()) - 1;
  std::ostringstream what;
  what << "E=" << E << " rows=" << l.rows << " k_in=" << k_in << " n_out=" << n_out << " trans_b=" << trans_b
       << " accumulate=" << accumulate << " in=" << dtype_name(in) << " out=" << dtype_name(out);
  const bool bf16_in = in == DType::BF16;
  const std::vector<float> a = routed_rows(l, k_in, seed, bf16_in);
  std::vector<float> b = random_values(E * n_out * k_in, seed + 1);
  if (bf16_in) b = testing::round_bf16(b);
  std::vector<float> c0 = random_values(l.rows * n_out, seed + 2);
  if (out == DType::BF16) c0 = testing::round_bf16(c0);
  const Shape b_shape = trans_b ? Shape{E, n_out, k_in} : Shape{E, k_in, n_out};

  std::vector<float> ref = c0;
  std::vector<int32_t> offsets = l.offsets;
  grouped_matmul(f32_tensor(ref.data(), {l.rows, n_out}), f32_tensor(const_cast<float*>(a.data()), {l.rows, k_in}),
                 f32_tensor(b.data(), b_shape), i32_tensor(offsets.data(), {E + 1}), trans_b, accumulate);

  DeviceBuffer da(in, {l.rows, k_in}), db(in, b_shape), dc(out, {l.rows, n_out}), doff(DType::I32, {E + 1});
  da.upload(a);
  db.upload(b);
  doff.upload_i32(l.offsets);
  if (accumulate) dc.upload(c0);  // otherwise c stays poisoned (NaN)
  grouped_matmul(dc, da, db, doff, trans_b, accumulate);
  const std::vector<float> got = dc.download();

  std::vector<float> got_in, ref_in;
  const int64_t first = l.offsets.front(), last = l.offsets.back();
  for (int64_t r = 0; r < l.rows; ++r) {
    for (int64_t j = 0; j < n_out; ++j) {
      const size_t i = static_cast<size_t>(r * n_out + j);
      if (r >= first && r < last) {
        got_in.push_back(got[i]);
        ref_in.push_back(ref[i]);
      } else if (accumulate) {
        EXPECT_TRUE(same_bits(got[i], c0[i])) << what.str() << ": row " << r << " outside the experts was written";
        if (!same_bits(got[i], c0[i])) return INFINITY;
      } else {
        EXPECT_TRUE(std::isnan(got[i])) << what.str() << ": row " << r << " outside the experts was written";
        if (!std::isnan(got[i])) return INFINITY;
      }
    }
  }
  const double err = testing::normalized_error(got_in, ref_in);
  EXPECT_LE(err, bf16_in ? kTolBf16 : kTolF32) << what.str();
  return err;
}

// accumulate = false: db starts as NaNs on both sides and must be fully overwritten (experts
// without rows: exact zeros).
double expect_wgrad_matches_cpu(const Layout& l, int64_t k_in, int64_t n_out, DType in, DType out, uint32_t seed,
                                double tol = -1, bool accumulate = true) {
  const int64_t E = static_cast<int64_t>(l.offsets.size()) - 1;
  std::ostringstream what;
  what << "wgrad" << (accumulate ? "" : " (overwrite)") << " E=" << E << " rows=" << l.rows << " k_in=" << k_in << " n_out=" << n_out << " in=" << dtype_name(in)
       << " out=" << dtype_name(out);
  const bool bf16_in = in == DType::BF16;
  const std::vector<float> dc = routed_rows(l, n_out, seed, bf16_in);
  const std::vector<float> a = routed_rows(l, k_in, seed + 1, bf16_in);
  std::vector<float> db0 = random_values(E * n_out * k_in, seed + 2);
  if (out == DType::BF16) db0 = testing::round_bf16(db0);
  if (!accumulate) std::fill(db0.begin(), db0.end(), std::numeric_limits<float>::quiet_NaN());

  std::vector<float> ref = db0;
  std::vector<int32_t> offsets = l.offsets;
  grouped_matmul_wgrad(f32_tensor(ref.data(), {E, n_out, k_in}),
                       f32_tensor(const_cast<float*>(dc.data()), {l.rows, n_out}),
                       f32_tensor(const_cast<float*>(a.data()), {l.rows, k_in}), i32_tensor(offsets.data(), {E + 1}),
                       {}, accumulate);

  DeviceBuffer ddb(out, {E, n_out, k_in}), ddc(in, {l.rows, n_out}), da(in, {l.rows, k_in}), doff(DType::I32, {E + 1});
  ddb.upload(db0);
  ddc.upload(dc);
  da.upload(a);
  doff.upload_i32(l.offsets);
  grouped_matmul_wgrad(ddb, ddc, da, doff, {}, accumulate);
  const std::vector<float> got = ddb.download();
  for (int64_t e = 0; e < E; ++e) {
    if (l.offsets[e] != l.offsets[e + 1]) continue;
    for (int64_t i = e * n_out * k_in; i < (e + 1) * n_out * k_in; ++i) {
      const float want = accumulate ? db0[i] : 0.0f;
      EXPECT_TRUE(same_bits(got[i], want)) << what.str() << ": expert " << e << " has no rows but db is " << got[i];
      if (!same_bits(got[i], want)) return INFINITY;
    }
  }
  const double err = testing::normalized_error(got, ref);
  EXPECT_LE(err, tol >= 0 ? tol : (bf16_in ? kTolBf16 : kTolF32)) << what.str();
  return err;
}

struct DtypePair {
  DType in, out;
};
const DtypePair kDtypes[] = {{DType::F32, DType::F32}, {DType::BF16, DType::BF16}, {DType::BF16, DType::F32}};

std::vector<Layout> layouts() {
  return {
      make_layout({200}, 0, 0),                          // E = 1, full buffer
      make_layout({1}, 3, 5),                            // E = 1, one row between unused rows
      make_layout(random_counts(8, 150, 1), 5, 70),      // E = 8, tiles straddle experts
      make_layout({0, 0, 0, 333, 0, 0, 0, 0}, 0, 64),    // all rows in one expert
      make_layout(random_counts(64, 40, 2), 17, 9),      // E = 64, many small and empty experts
      make_layout(std::vector<int32_t>(64, 0), 0, 128),  // E = 64, no rows at all
  };
}
#endif

TEST(CudaGroupedGemm, ForwardMatchesCpuForEveryLayoutAndDtype) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  uint32_t seed = 1000;
  for (const Layout& l : layouts())
    for (const DtypePair& d : kDtypes)
      for (bool trans_b : {false, true})
        for (bool accumulate : {false, true})
          expect_grouped_matmul_matches_cpu(l, 67, 45, trans_b, accumulate, d.in, d.out, seed += 3);
#endif
}

TEST(CudaGroupedGemm, ForwardMatchesCpuAtModelSizes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const Layout l = make_layout(random_counts(8, 600, 3), 0, 100);
  uint32_t seed = 2000;
  for (const DtypePair& d : kDtypes)
    for (bool trans_b : {false, true})
      expect_grouped_matmul_matches_cpu(l, 512, 256, trans_b, false, d.in, d.out, seed += 3);
#endif
}

TEST(CudaGroupedGemm, WgradMatchesCpuForEveryLayoutAndDtype) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  uint32_t seed = 3000;
  for (const Layout& l : layouts())
    for (const DtypePair& d : kDtypes) expect_wgrad_matches_cpu(l, 67, 45, d.in, d.out, seed += 3);
  const Layout big = make_layout(random_counts(8, 600, 4), 0, 100);
  for (const DtypePair& d : kDtypes) expect_wgrad_matches_cpu(big, 512, 256, d.in, d.out, seed += 3);
#endif
}

TEST(CudaGroupedGemm, WgradIsDeterministic) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const Layout l = make_layout(random_counts(8, 300, 5), 0, 0);
  const int64_t E = 8, n_out = 96, k_in = 80;
  DeviceBuffer dc(DType::BF16, {l.rows, n_out}), a(DType::BF16, {l.rows, k_in}), off(DType::I32, {E + 1});
  DeviceBuffer db1(DType::F32, {E, n_out, k_in}), db2(DType::F32, {E, n_out, k_in});
  dc.upload(random_values(l.rows * n_out, 6));
  a.upload(random_values(l.rows * k_in, 7));
  off.upload_i32(l.offsets);
  const std::vector<float> zeros(static_cast<size_t>(E * n_out * k_in), 0.0f);
  db1.upload(zeros);
  db2.upload(zeros);
  grouped_matmul_wgrad(db1, dc, a, off);
  grouped_matmul_wgrad(db2, dc, a, off);
  EXPECT_EQ(db1.download(), db2.download());
#endif
}

TEST(CudaGroupedGemm, MismatchedDtypesAreRefused) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer a(DType::F32, {4, 8}), b(DType::BF16, {2, 8, 6}), c(DType::F32, {4, 6}), off(DType::I32, {3});
  EXPECT_THROW(grouped_matmul(c, a, b, off, false, false), Error);
  DeviceBuffer b32(DType::F32, {2, 8, 6}), c16(DType::BF16, {4, 6});
  EXPECT_THROW(grouped_matmul(c16, a, b32, off, false, false), Error);
  DeviceBuffer off_bad(DType::I32, {2});
  EXPECT_THROW(grouped_matmul(c, a, b32, off_bad, false, false), Error);
#endif
}

#if defined(MOE_HAVE_CUDA)
// Layouts for the CUTLASS path: several empty experts, one expert with every row, tiles that
// straddle experts, a partial last tile, unused rows before and after.
std::vector<Layout> model_layouts() {
  return {
      make_layout({0, 0, 0, 1000, 0, 0, 0, 0}, 0, 24),          // every row in one expert
      make_layout({0, 37, 0, 0, 300, 1, 128, 0}, 8, 40),        // several empty experts, odd counts
      make_layout(random_counts(16, 260, 11), 3, 129),          // every fifth expert empty
      make_layout(std::vector<int32_t>(8, 0), 0, 64),           // no rows at all
  };
}

struct Dims {
  int64_t k_in, n_out;
};
// Multiples of 8 from 64 to 512: the model's ratios (2H = D, H = D / 2) and K = N.
const Dims kModelDims[] = {{64, 64}, {128, 256}, {256, 128}, {512, 512}, {136, 72}};

void print_error(const char* what, double worst) {
  std::printf("  [%s] path=%s worst normalized error %.3g\n", what,
              cuda::grouped_gemm_uses_cutlass() ? "cutlass" : "tiled", worst);
}
#endif

TEST(CudaGroupedGemm, Bf16ProductsMatchCpuAtModelShapes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  uint32_t seed = 5000;
  double worst = 0;
  for (const Layout& l : model_layouts())
    for (const Dims& d : kModelDims)
      for (bool trans_b : {true, false})
        for (bool accumulate : {false, true})
          worst = std::max(worst, expect_grouped_matmul_matches_cpu(l, d.k_in, d.n_out, trans_b, accumulate,
                                                                    DType::BF16, DType::BF16, seed += 3));
  print_error("bf16 grouped_matmul", worst);
#endif
}

TEST(CudaGroupedGemm, Bf16WgradAccumulatesIntoF32AtModelShapes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  uint32_t seed = 6000;
  double worst = 0;
  const double tol = cuda::grouped_gemm_uses_cutlass() ? kTolF32 : kTolBf16;
  for (const Layout& l : model_layouts())
    for (const Dims& d : kModelDims)
      worst = std::max(worst, expect_wgrad_matches_cpu(l, d.k_in, d.n_out, DType::BF16, DType::F32, seed += 3, tol));
  print_error("bf16 -> f32 grouped_matmul_wgrad", worst);
#endif
}

#if defined(MOE_HAVE_CUDA)
// CPU references of the three products on the rows of `offsets` (inputs already BF16-exact).
std::vector<float> cpu_matmul(std::vector<float> c, const std::vector<float>& a, const std::vector<float>& b,
                              std::vector<int32_t> offsets, int64_t rows, int64_t k_in, int64_t n_out, bool trans_b) {
  const int64_t E = static_cast<int64_t>(offsets.size()) - 1;
  const Shape b_shape = trans_b ? Shape{E, n_out, k_in} : Shape{E, k_in, n_out};
  grouped_matmul(f32_tensor(c.data(), {rows, n_out}), f32_tensor(const_cast<float*>(a.data()), {rows, k_in}),
                 f32_tensor(const_cast<float*>(b.data()), b_shape), i32_tensor(offsets.data(), {E + 1}), trans_b,
                 false);
  return c;
}
#endif

// The first microbatch of a step writes the expert gradients (no read of db): every element is
// overwritten, experts without rows become zero, values equal the CPU's.
TEST(CudaGroupedGemm, WgradOverwriteMatchesCpuAndZeroesEmptyExperts) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  uint32_t seed = 3500;
  for (const Layout& l : layouts())
    for (const DtypePair& d : kDtypes) expect_wgrad_matches_cpu(l, 67, 45, d.in, d.out, seed += 3, -1, false);
  const double tol = cuda::grouped_gemm_uses_cutlass() ? kTolF32 : kTolBf16;
  for (const Layout& l : model_layouts())
    for (const Dims& d : kModelDims)
      expect_wgrad_matches_cpu(l, d.k_in, d.n_out, DType::BF16, DType::F32, seed += 3, tol, false);
#endif
}

TEST(CudaGroupedGemm, CapturedGraphReplaysWithNewOffsets) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  // x [R, K] -(w [E, N, K], trans_b)-> y [R, N]; dy [R, N] -(w, no trans)-> dx [R, K]; g[e] += dy^T x.
  const int64_t E = 8, R = 640, K = 128, N = 192;
  const std::vector<std::vector<int32_t>> offset_sets = {
      {0, 100, 100, 250, 251, 400, 400, 400, 600},  // empty experts, partial tiles
      {5, 5, 5, 5, 5, 5, 5, 5, 5},                  // no rows
      {0, 0, 0, 0, 0, 0, 0, 0, 640},                // every row in the last expert
  };
  std::vector<float> x = testing::round_bf16(random_values(R * K, 71));
  std::vector<float> dy = testing::round_bf16(random_values(R * N, 72));
  const std::vector<float> w = testing::round_bf16(random_values(E * N * K, 73));
  const std::vector<float> g0 = random_values(E * N * K, 74);
  DeviceBuffer dx_in(DType::BF16, {R, K}), ddy(DType::BF16, {R, N}), dw(DType::BF16, {E, N, K});
  DeviceBuffer dy_out(DType::BF16, {R, N}), ddx(DType::BF16, {R, K}), dg(DType::F32, {E, N, K});
  DeviceBuffer doff(DType::I32, {E + 1});
  dx_in.upload(x);
  ddy.upload(dy);
  dw.upload(w);
  dg.upload(g0);
  doff.upload_i32(offset_sets[0]);

  // A blocking stream (ordered with the synchronous copies), never destroyed: a later stream could
  // reuse the handle and find this one's scratch.
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  const Stream s{stream};
  auto step = [&] {
    grouped_matmul(dy_out, dx_in, dw, doff, true, false, s);
    grouped_matmul(ddx, ddy, dw, doff, false, false, s);
    grouped_matmul_wgrad(dg, ddy, dx_in, doff, s);
  };
  step();  // eager: allocates the stream's scratch
  CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  step();
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  double worst = 0;
  for (size_t set = 0; set < offset_sets.size(); ++set) {
    const std::vector<int32_t>& off = offset_sets[set];
    doff.upload_i32(off);
    dg.upload(g0);
    CUDA_CHECK(cudaMemset(dy_out.tensor().data, 0xff, dy_out.bytes()));  // NaN: rows outside stay NaN
    CUDA_CHECK(cudaMemset(ddx.tensor().data, 0xff, ddx.bytes()));
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));

    const std::vector<float> nan_y(static_cast<size_t>(R * N), NAN), nan_x(static_cast<size_t>(R * K), NAN);
    const std::vector<float> ref_y = cpu_matmul(nan_y, x, w, off, R, K, N, true);
    const std::vector<float> ref_x = cpu_matmul(nan_x, dy, w, off, R, N, K, false);
    std::vector<float> ref_g = g0;
    std::vector<int32_t> off_copy = off;
    grouped_matmul_wgrad(f32_tensor(ref_g.data(), {E, N, K}), f32_tensor(dy.data(), {R, N}),
                         f32_tensor(x.data(), {R, K}), i32_tensor(off_copy.data(), {E + 1}));
    const std::vector<float> got_y = dy_out.download(), got_x = ddx.download(), got_g = dg.download();
    // Rows outside [off[0], off[E]) must still be NaN in both outputs; inside, compare.
    auto compare_rows = [&](const std::vector<float>& got, const std::vector<float>& ref, int64_t cols,
                            const char* name) {
      std::vector<float> got_in, ref_in;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t j = 0; j < cols; ++j) {
          const size_t i = static_cast<size_t>(r * cols + j);
          if (r >= off.front() && r < off.back()) {
            got_in.push_back(got[i]);
            ref_in.push_back(ref[i]);
          } else {
            ASSERT_TRUE(std::isnan(got[i])) << name << " offset set " << set << ": row " << r << " was written";
          }
        }
      const double err = testing::normalized_error(got_in, ref_in);
      EXPECT_LE(err, kTolBf16) << name << " offset set " << set;
      worst = std::max(worst, err);
    };
    compare_rows(got_y, ref_y, N, "forward");
    compare_rows(got_x, ref_x, K, "backward data");
    for (int64_t e = 0; e < E; ++e) {
      if (off[e] != off[e + 1]) continue;
      for (int64_t i = e * N * K; i < (e + 1) * N * K; ++i)
        ASSERT_TRUE(same_bits(got_g[i], g0[i])) << "wgrad offset set " << set << ": empty expert " << e << " changed";
    }
    const double err_g = testing::normalized_error(got_g, ref_g);
    EXPECT_LE(err_g, kTolBf16) << "wgrad offset set " << set;
    worst = std::max(worst, err_g);
  }
  print_error("graph replay, 3 offset sets", worst);
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
#endif
}

TEST(CudaGroupedGemm, FirstCallOnAStreamInsideCaptureIsRefused) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  if (!cuda::grouped_gemm_uses_cutlass()) GTEST_SKIP() << "the tiled kernels allocate nothing";
  const int64_t E = 2, R = 16, K = 64, N = 64;
  DeviceBuffer a(DType::BF16, {R, K}), b(DType::BF16, {E, N, K}), c(DType::BF16, {R, N}), off(DType::I32, {E + 1});
  off.upload_i32({0, 8, 16});
  cudaStream_t stream = nullptr;  // fresh and never destroyed (see above): it has no scratch yet
  CUDA_CHECK(cudaStreamCreate(&stream));
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  EXPECT_THROW(grouped_matmul(c, a, b, off, true, false, Stream{stream}), Error);
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  if (graph != nullptr) CUDA_CHECK(cudaGraphDestroy(graph));
#endif
}

#if defined(MOE_HAVE_CUDA)
std::vector<int32_t> even_counts(int E, int64_t total) {
  std::vector<int32_t> counts(static_cast<size_t>(E), static_cast<int32_t>(total / E));
  counts[0] += static_cast<int32_t>(total - total / E * E);
  return counts;
}

// Zipf-like load (expert e gets ~1/(e+1) of the rows), the last 4 experts empty.
std::vector<int32_t> skewed_counts(int E, int64_t total) {
  std::vector<double> w(static_cast<size_t>(E), 0.0);
  double sum = 0;
  for (int e = 0; e < E - 4; ++e) sum += (w[e] = 1.0 / (e + 1));
  std::vector<int32_t> counts(static_cast<size_t>(E), 0);
  int64_t given = 0;
  for (int e = 0; e < E; ++e) given += counts[e] = static_cast<int32_t>(total * w[e] / sum);
  counts[0] += static_cast<int32_t>(total - given);
  return counts;
}
#endif

// MOE_BENCH=1: ms and TFLOP/s of the six expert products at the bench-olmoe-4l shapes (64 experts,
// 32768 x 8 rows, d 2048, h 1024; even and skewed loads) and the MoE-layer sweep (32768 tokens,
// top-4, 8..128 experts), CUTLASS against the tiled kernels where affordable.
TEST(CudaGroupedGemm, TimingAtBenchShapes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  MOE_SKIP_UNLESS_BENCH("timing");
  const int64_t D = 2048, H = 1024, max_rows = 32768 * 8, max_e = 128;
  // Buffers sized for the largest case; values do not matter for timing (bf16 0x3c3c ~ 0.0115).
  DeviceBuffer in(DType::BF16, {max_rows, 2 * H}), out(DType::BF16, {max_rows, 2 * H});
  DeviceBuffer w(DType::BF16, {max_e, 2 * H, D}), g(DType::F32, {max_e, 2 * H, D}), off(DType::I32, {max_e + 1});
  for (const DeviceBuffer* b : {&in, &out, &w, &g}) CUDA_CHECK(cudaMemset(b->tensor().data, 0x3c, b->bytes()));
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  const Stream s{stream};
  std::printf("grouped GEMM timing, path=%s (BF16 in; products BF16 out, wgrad F32 +=)\n",
              cuda::grouped_gemm_uses_cutlass() ? "cutlass" : "tiled");
  std::printf("%-28s %-22s %9s %9s %9s %9s\n", "case", "product", "new ms", "TFLOP/s", "old ms", "TFLOP/s");

  enum Kind { kNt, kNn, kWgrad };
  struct Product {
    const char* name;
    Kind kind;
    int64_t n_out, k_in;
  };
  const Product products[] = {
      {"fwd gate_up  x.Wgu^T", kNt, 2 * H, D},    {"fwd down     a.Wd^T", kNt, D, H},
      {"dgrad down   dy.Wd", kNn, H, D},          {"dgrad gate_up dgu.Wgu", kNn, D, 2 * H},
      {"wgrad down   dy^T.a", kWgrad, D, H},      {"wgrad gate_up dgu^T.x", kWgrad, 2 * H, D},
  };
  struct Case {
    std::string name;
    std::vector<int32_t> counts;
    bool time_old;
  };
  std::vector<Case> cases = {{"olmoe-4l E64 even", even_counts(64, max_rows), true},
                             {"olmoe-4l E64 skewed", skewed_counts(64, max_rows), false}};
  for (int n : {8, 16, 32, 64, 128})
    cases.push_back({"sweep T32768 k4 E" + std::to_string(n), even_counts(n, 32768 * 4), false});

  for (const Case& c : cases) {
    const int64_t E = static_cast<int64_t>(c.counts.size());
    std::vector<int32_t> offsets{0};
    for (int32_t n : c.counts) offsets.push_back(offsets.back() + n);
    const int64_t rows = offsets.back();
    off.upload_i32([&] {
      std::vector<int32_t> o = offsets;
      o.resize(static_cast<size_t>(max_e + 1), offsets.back());
      return o;
    }());
    const Tensor offsets_t = front(off, DType::I32, {E + 1});
    double layer_new = 0, layer_old = 0, layer_flop = 0;
    for (const Product& p : products) {
      // Data products: in [rows, k_in] -> out [rows, n_out]; wgrad: dc = out [rows, n_out], a = in [rows, k_in].
      const Tensor x = front(in, DType::BF16, {rows, p.k_in});
      const Tensor y = front(out, DType::BF16, {rows, p.n_out});
      const Shape w_shape = p.kind == kNn ? Shape{E, p.k_in, p.n_out} : Shape{E, p.n_out, p.k_in};
      const Tensor wt = front(w, DType::BF16, w_shape);
      const Tensor gt = front(g, DType::F32, {E, p.n_out, p.k_in});
      auto run_new = [&] {
        if (p.kind == kWgrad) grouped_matmul_wgrad(gt, y, x, offsets_t, s);
        else grouped_matmul(y, x, wt, offsets_t, p.kind == kNt, false, s);
      };
      auto run_old = [&] {
        if (p.kind == kWgrad) cuda::grouped_matmul_wgrad_tiled(gt, y, x, offsets_t, s);
        else cuda::grouped_matmul_tiled(y, x, wt, offsets_t, p.kind == kNt, false, s);
      };
      const double flop = 2.0 * static_cast<double>(rows) * p.n_out * p.k_in;
      const double ms_new = time_ms(run_new, stream, 3, 20);
      const double ms_old = c.time_old ? time_ms(run_old, stream, 1, 1) : 0;
      layer_new += ms_new;
      layer_old += ms_old;
      layer_flop += flop;
      std::printf("%-28s %-22s %9.3f %9.1f", c.name.c_str(), p.name, ms_new, flop / ms_new * 1e-9);
      if (c.time_old) std::printf(" %9.2f %9.1f", ms_old, flop / ms_old * 1e-9);
      std::printf("\n");
    }
    std::printf("%-28s %-22s %9.3f %9.1f", c.name.c_str(), "all six (one layer)", layer_new,
                layer_flop / layer_new * 1e-9);
    if (c.time_old) std::printf(" %9.2f %9.1f", layer_old, layer_flop / layer_old * 1e-9);
    std::printf("\n");
    std::fflush(stdout);
  }
#endif
}

}  // namespace
}  // namespace moe

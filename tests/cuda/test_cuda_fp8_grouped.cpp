// fp8_grouped_matmul / fp8_grouped_matmul_wgrad on the GPU (ops/cuda/fp8_grouped_gemm.cu: CUTLASS's
// Hopper grouped GEMM with blockwise scaling) against the CPU ops (the same products emulated
// exactly: dequantized operands multiplied in FP32), with the per-expert offsets only on the
// device. The CPU quantize ops (the GPU's bits) make the operands in the tile layouts of
// moe/ops/fp8.h: Rows activations, Blocks weights and their transposed cache (the data gradient),
// and the transposed segmented columns operands of the weight gradient. Values carry a random
// power-of-two magnitude per row and per 128-column block, so every tile gets its own scale and a
// scale read from the wrong tile shows.
//
// Tolerances, per element, relative to the sum of |a||b| over the contraction (the error scale of a
// dot product; the CPU op on the operands' magnitudes): BF16 output (forward, data gradient)
// <= 8e-3 (BF16 rounding alone is up to 2^-8 of |c| <= sum|a||b|; the FP8 tensor cores keep about
// 14 bits while accumulating each 128-deep slice, ~1e-4), F32 output (weight gradient) <= 1e-3;
// normalized error ||got - ref|| / ||ref|| <= 5e-3 (BF16 rounding alone gives ~1.7e-3) and 1e-3.
// One tile's scale doubled gives ~0.2 per element (and 0.03-0.2 normalized) in these shapes. The
// products themselves are exact on both sides (E4M3 x E4M3 with power-of-two scales), so the
// difference is summation order and the GPU's accumulation. Rows outside the experts and experts
// without rows must be bit-exact (untouched, or zeros when the weight gradient overwrites).
//
// The error test runs without a GPU (the host checks come before any device call). MOE_BENCH=1
// also runs the timing test at the bench-olmoe-4l expert shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/fp8.h"
#include "moe/ops/fp8.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;
using testing::time_ms;

constexpr double kBoundTolBf16 = 8e-3, kNormTolBf16 = 5e-3;
constexpr double kBoundTolF32 = 1e-3, kNormTolF32 = 1e-3;

int64_t tiles(int64_t n) { return (n + kFp8Tile - 1) / kFp8Tile; }
bool same_bits(float x, float y) { return std::memcmp(&x, &y, sizeof(float)) == 0; }

// Uniform(-1, 1) times 2^(r_i + c_j), r per block of 37 rows and c per column, both in [-3, 3]:
// the 1 x 128 tiles' scales differ between neighbouring columns (the Columns operands' features) and
// between 128-row tiles, so a product that reads a scale from the wrong place shows.
std::vector<float> tiled_values(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> mag(-3, 3);
  std::vector<int> row_mag(static_cast<size_t>((rows + 36) / 37)), col_mag(static_cast<size_t>(cols));
  for (int& m : row_mag) m = mag(rng);
  for (int& m : col_mag) m = mag(rng);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) v[r * cols + c] = std::ldexp(u(rng), row_mag[r / 37] + col_mag[c]);
  return v;
}

// An FP8 operand in host memory, quantized by the CPU ops.
struct HostFp8 {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  Fp8Tensor t;
  HostFp8(Shape shape, Fp8Tiles tiles)
      : codes(static_cast<size_t>(shape.numel())), scales(static_cast<size_t>(fp8_scale_shape(shape, tiles).numel())) {
    t = {Tensor(codes.data(), DType::FP8_E4M3, shape), f32_tensor(scales.data(), fp8_scale_shape(shape, tiles)),
         tiles};
  }
  HostFp8(const HostFp8&) = delete;
  HostFp8& operator=(const HostFp8&) = delete;
  // The same tiles with every value's magnitude: the operand of the |a||b| bound.
  void take_magnitudes_of(const HostFp8& q) {
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = q.codes[i] & 0x7f;  // E4M3's sign bit
    scales = q.scales;                                                        // positive powers of two
  }
};

void quantize_rows(HostFp8& q, std::vector<float> x) {
  fp8_quantize_rows(q.t, f32_tensor(x.data(), q.t.codes.shape));
}
// w [E, N, K] -> q, and its transposed cache into q_t when given.
void quantize_blocks(HostFp8& q, HostFp8* q_t, std::vector<float> w) {
  fp8_quantize_blocks(q.t, q_t != nullptr ? q_t->t : Fp8Tensor{}, f32_tensor(w.data(), q.t.codes.shape));
}
// x [M, K] -> q (codes [K, Mp]) with segments from offsets.
void quantize_columns(HostFp8& q, std::vector<float> x, int64_t M, std::vector<int32_t> offsets) {
  fp8_quantize_columns(q.t, f32_tensor(x.data(), {M, q.t.codes.dim(0)}),
                       i32_tensor(offsets.data(), {static_cast<int64_t>(offsets.size())}));
}

// An FP8 operand on the device.
struct DeviceFp8 {
  DeviceBuffer codes, scales;
  Fp8Tiles tiles;
  explicit DeviceFp8(const HostFp8& h)
      : codes(DType::FP8_E4M3, h.t.codes.shape), scales(DType::F32, h.t.scales.shape), tiles(h.t.tiles) {
    upload(h);
  }
  void upload(const HostFp8& h) {
    EXPECT_EQ(h.codes.size(), codes.bytes());
    EXPECT_EQ(h.scales.size() * sizeof(float), scales.bytes());
    CUDA_CHECK(cudaMemcpy(codes.tensor().data, h.codes.data(), codes.bytes(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(scales.tensor().data, h.scales.data(), scales.bytes(), cudaMemcpyHostToDevice));
  }
  operator Fp8Tensor() const { return {codes.tensor(), scales.tensor(), tiles}; }
};

struct Layout {
  std::vector<int32_t> offsets;  // [E+1]
  int64_t rows = 0;              // buffer rows, >= offsets[E]
};

Layout make_layout(const std::vector<int32_t>& counts, int32_t lead, int32_t tail) {
  Layout l;
  l.offsets.push_back(lead);
  for (int32_t c : counts) l.offsets.push_back(l.offsets.back() + c);
  l.rows = l.offsets.back() + tail;
  return l;
}

// Skewed loads: expert e gets ~total / (e + 1) rows (Zipf-like), every fifth expert none, and the
// counts are not multiples of 128.
std::vector<int32_t> skewed_counts(int E, int64_t total, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> jitter(0, 37);
  std::vector<int32_t> counts(static_cast<size_t>(E), 0);
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += e % 5 == 2 ? 0 : 1.0 / (e + 1);
  for (int e = 0; e < E; ++e)
    if (e % 5 != 2) counts[e] = static_cast<int32_t>(total / (e + 1) / sum) + jitter(rng);
  return counts;
}

// got against ref where `compare(i)`, with the per-element bound tol * bound[i] and the normalized
// error; reports the worst element of a failure.
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<float>& bound,
                  const std::function<bool(size_t)>& compare, double bound_tol, double norm_tol,
                  const std::string& what) {
  std::vector<float> got_in, ref_in;
  double worst = 0;
  size_t worst_i = 0, bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!compare(i)) continue;
    got_in.push_back(got[i]);
    ref_in.push_back(ref[i]);
    const double ratio = std::fabs(static_cast<double>(got[i]) - ref[i]) / std::max<double>(bound[i], 1e-30);
    if (!(ratio <= bound_tol)) ++bad;
    if (!(ratio <= worst)) worst = ratio, worst_i = i;
  }
  const double err = testing::normalized_error(got_in, ref_in);
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements off by more than " << bound_tol
                     << " x sum|a||b|; worst at " << worst_i << ": got " << got[worst_i] << ", want " << ref[worst_i]
                     << " (bound " << bound[worst_i] << ")";
  EXPECT_LE(err, norm_tol) << what;
  std::printf("  [%s] normalized error %.3g, worst |got - ref| / sum|a||b| %.3g\n", what.c_str(), err, worst);
}

// The CPU op's forward product c [rows, n_out] (F32; rows outside the experts 0).
std::vector<float> cpu_product(const HostFp8& a, const HostFp8& b, std::vector<int32_t> offsets) {
  std::vector<float> c(static_cast<size_t>(a.t.codes.dim(0) * b.t.codes.dim(1)), 0.0f);
  fp8_grouped_matmul(f32_tensor(c.data(), {a.t.codes.dim(0), b.t.codes.dim(1)}), a.t, b.t,
                     i32_tensor(offsets.data(), {static_cast<int64_t>(offsets.size())}));
  return c;
}
// sum_k |a||b| of the forward product.
std::vector<float> cpu_product_bound(const HostFp8& a, const HostFp8& b, const std::vector<int32_t>& offsets) {
  HostFp8 abs_a(a.t.codes.shape, a.t.tiles), abs_b(b.t.codes.shape, b.t.tiles);
  abs_a.take_magnitudes_of(a);
  abs_b.take_magnitudes_of(b);
  return cpu_product(abs_a, abs_b, offsets);
}

// The CPU op's weight gradient: db0 (+)= the product.
std::vector<float> cpu_wgrad(std::vector<float> db0, Shape db_shape, const HostFp8& dc_t, const HostFp8& x_t,
                             std::vector<int32_t> offsets, bool accumulate) {
  fp8_grouped_matmul_wgrad(f32_tensor(db0.data(), db_shape), dc_t.t, x_t.t,
                           i32_tensor(offsets.data(), {static_cast<int64_t>(offsets.size())}), accumulate);
  return db0;
}
std::vector<float> cpu_wgrad_bound(Shape db_shape, const HostFp8& dc_t, const HostFp8& x_t,
                                   const std::vector<int32_t>& offsets) {
  HostFp8 abs_dc(dc_t.t.codes.shape, dc_t.t.tiles), abs_x(x_t.t.codes.shape, x_t.t.tiles);
  abs_dc.take_magnitudes_of(dc_t);
  abs_x.take_magnitudes_of(x_t);
  return cpu_wgrad(std::vector<float>(static_cast<size_t>(db_shape.numel())), db_shape, abs_dc, abs_x, offsets,
                   false);
}

// c = a * b[e]^T per expert on the GPU against the CPU op: a Rows [rows, k_in] from random values
// (rows outside [o_0, o_E) hold NaN codes and scales: never read), b Blocks [E, n_out, k_in];
// c starts as NaN and keeps it outside the experts (never written).
void expect_product_matches_cpu(const Layout& l, const HostFp8& b, uint32_t seed, const std::string& what) {
  const int64_t E = b.t.codes.dim(0), n_out = b.t.codes.dim(1), k_in = b.t.codes.dim(2), rows = l.rows;
  const int64_t first = l.offsets.front(), last = l.offsets.back();
  HostFp8 a({rows, k_in}, Fp8Tiles::Rows);
  quantize_rows(a, tiled_values(rows, k_in, seed));
  for (int64_t r = 0; r < rows; ++r) {
    if (r >= first && r < last) continue;
    std::fill_n(&a.codes[r * k_in], k_in, fp8::kE4m3NanCode);
    std::fill_n(&a.scales[r * tiles(k_in)], tiles(k_in), std::numeric_limits<float>::quiet_NaN());
  }
  const std::vector<float> ref = cpu_product(a, b, l.offsets), bound = cpu_product_bound(a, b, l.offsets);

  DeviceFp8 da(a), db(b);
  DeviceBuffer dc(DType::BF16, {rows, n_out}), doff(DType::I32, {E + 1});  // c poisoned: NaN
  doff.upload_i32(l.offsets);
  fp8_grouped_matmul(dc, da, db, doff, {});
  const std::vector<float> got = dc.download();

  for (int64_t r = 0; r < rows; ++r) {
    if (r >= first && r < last) continue;
    for (int64_t j = 0; j < n_out; ++j)
      ASSERT_TRUE(std::isnan(got[r * n_out + j])) << what << ": row " << r << " outside the experts was written";
  }
  auto in_experts = [&](size_t i) {
    const int64_t r = static_cast<int64_t>(i) / n_out;
    return r >= first && r < last;
  };
  expect_close(got, ref, bound, in_experts, kBoundTolBf16, kNormTolBf16, what);
}

// Weights [E, n_out, k_in] quantized to Blocks (and the transposed cache when asked).
struct Weights {
  HostFp8 w, w_t;
  Weights(int64_t E, int64_t n_out, int64_t k_in, uint32_t seed)
      : w({E, n_out, k_in}, Fp8Tiles::Blocks), w_t({E, k_in, n_out}, Fp8Tiles::Blocks) {
    quantize_blocks(w, &w_t, tiled_values(E * n_out, k_in, seed));
  }
};

// db[e] (+)= dc_e^T x_e on the GPU against the CPU op, from the columns operands of dc [M, n_out]
// and x [M, k_in] quantized with offsets (offsets[0] = 0; rows past offsets[E] belong to no
// expert), Mp = fp8_columns_capacity plus `extra_columns`. accumulate = false starts db as NaN,
// which every element must overwrite.
void expect_wgrad_matches_cpu(const std::vector<int32_t>& counts, int32_t tail, int64_t n_out, int64_t k_in,
                              int64_t extra_columns, bool accumulate, uint32_t seed, const std::string& what) {
  const Layout l = make_layout(counts, 0, tail);
  const int64_t E = static_cast<int64_t>(counts.size()), M = l.rows;
  const int64_t Mp = fp8_columns_capacity(M, E) + extra_columns;
  HostFp8 dc_t({n_out, Mp}, Fp8Tiles::Columns), x_t({k_in, Mp}, Fp8Tiles::Columns);
  quantize_columns(dc_t, tiled_values(M, n_out, seed), M, l.offsets);
  quantize_columns(x_t, tiled_values(M, k_in, seed + 1), M, l.offsets);

  std::mt19937 rng(seed + 2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> db0(static_cast<size_t>(E * n_out * k_in));
  for (float& v : db0) v = accumulate ? u(rng) : std::numeric_limits<float>::quiet_NaN();
  const Shape db_shape{E, n_out, k_in};
  const std::vector<float> ref = cpu_wgrad(db0, db_shape, dc_t, x_t, l.offsets, accumulate);
  std::vector<float> bound = cpu_wgrad_bound(db_shape, dc_t, x_t, l.offsets);
  if (accumulate)  // the FP32 add of db0 rounds at 2^-24 of the sum
    for (size_t i = 0; i < bound.size(); ++i) bound[i] += std::fabs(db0[i]) * 1e-4f;

  DeviceFp8 ddc(dc_t), dx(x_t);
  DeviceBuffer ddb(DType::F32, db_shape), doff(DType::I32, {E + 1});
  ddb.upload(db0);
  doff.upload_i32(l.offsets);
  fp8_grouped_matmul_wgrad(ddb, ddc, dx, doff, accumulate, {});
  const std::vector<float> got = ddb.download();

  const int64_t per_expert = n_out * k_in;
  for (int64_t e = 0; e < E; ++e) {
    if (counts[e] != 0) continue;
    for (int64_t i = e * per_expert; i < (e + 1) * per_expert; ++i) {
      const float want = accumulate ? db0[i] : 0.0f;
      ASSERT_TRUE(same_bits(got[i], want)) << what << ": expert " << e << " has no rows but db is " << got[i];
    }
  }
  expect_close(
      got, ref, bound, [&](size_t i) { return counts[static_cast<int64_t>(i) / per_expert] != 0; }, kBoundTolF32,
      kNormTolF32, what);
}

// OLMoE-1B-7B's expert dims: d = 2048, expert hidden h = 1024 (gate/up N = 2h, down K = h).
constexpr int64_t kD = 2048, kH = 1024;
#endif

TEST(CudaFp8Grouped, ForwardMatchesCpuAtModelShapes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  // 8 experts, skewed with empty experts and counts not multiples of 128, unused rows around them.
  const Layout l8 = make_layout(skewed_counts(8, 2400, 1), 37, 90);
  expect_product_matches_cpu(l8, Weights(8, 2 * kH, kD, 2).w, 3, "forward gate_up E=8");
  expect_product_matches_cpu(l8, Weights(8, kD, kH, 4).w, 5, "forward down E=8");
  // 64 experts, many small or empty.
  expect_product_matches_cpu(make_layout(skewed_counts(64, 4000, 6), 0, 0), Weights(64, kH, kD, 7).w, 8,
                             "forward E=64 n=1024 k=2048");
  // Every row in one expert, and one row in total.
  expect_product_matches_cpu(make_layout({0, 0, 0, 1000, 0, 0, 0, 0}, 0, 24), Weights(8, 256, 512, 9).w, 10,
                             "forward one busy expert");
  expect_product_matches_cpu(make_layout({0, 1}, 3, 5), Weights(2, 256, 256, 11).w, 12, "forward one row");
#endif
}

// The data gradient runs the same product on the weights' transposed Blocks cache.
TEST(CudaFp8Grouped, DataGradientWithTransposedCacheMatchesCpu) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const Layout l = make_layout(skewed_counts(8, 2400, 21), 5, 11);
  // down: w [E, d, h]; dx [rows, h] = dy [rows, d] w[e]: b = w_t [E, h, d].
  expect_product_matches_cpu(l, Weights(8, kD, kH, 22).w_t, 23, "data gradient down E=8");
  // gate_up: w [E, 2h, d]; dx [rows, d] = dgu [rows, 2h] w[e]: b = w_t [E, d, 2h].
  expect_product_matches_cpu(l, Weights(8, 2 * kH, kD, 24).w_t, 25, "data gradient gate_up E=8");
#endif
}

// Dims that are not multiples of 128: partial scale tiles at the edges of K and N.
TEST(CudaFp8Grouped, PartialTilesMatchCpu) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  expect_product_matches_cpu(make_layout({130, 0, 77, 300}, 2, 3), Weights(4, 200, 144, 31).w, 32,
                             "forward n=200 k=144");
  expect_wgrad_matches_cpu({130, 0, 77, 300}, 9, 200, 144, 0, true, 33, "wgrad n=200 k=144");
  // One and three 128-deep K tiles in the forward (the products above have even counts).
  expect_product_matches_cpu(make_layout({130, 0, 77, 300}, 2, 3), Weights(4, 256, 112, 34).w, 35,
                             "forward n=256 k=112 (one K tile)");
  expect_product_matches_cpu(make_layout({130, 0, 77, 300}, 2, 3), Weights(4, 256, 384, 36).w, 37,
                             "forward n=256 k=384 (three K tiles)");
  // An odd count of N tiles (a persistent grid's tile walk must not assume pairs).
  expect_product_matches_cpu(make_layout({130, 0, 77, 300}, 2, 3), Weights(4, 384, 256, 38).w, 39,
                             "forward n=384 k=256 (three N tiles)");
#endif
}

// Our own SM90 kernel (MOE_FP8_NT_KERNEL=sm90, fp8_grouped_gemm_sm90.h) in both launch forms (one
// CTA per tile; 2-CTA clusters sharing A by multicast) and both pipeline depths (5 stages; 6 with the
// output tile stored one 64-column box at a time) on the forward / data-gradient cases above.
TEST(CudaFp8Grouped, Sm90KernelMatchesCpu) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  struct EnvGuard {  // restores the CUTLASS default for the tests after this one
    ~EnvGuard() { unsetenv("MOE_FP8_NT_KERNEL"), unsetenv("MOE_SM90_CLUSTER"), unsetenv("MOE_SM90_STAGES"); }
  } guard;
  setenv("MOE_FP8_NT_KERNEL", "sm90", 1);
  for (const char* form_env : {"1/5", "2/5", "1/6", "2/6"}) {
    const std::string cluster(form_env, 1), stages(form_env + 2);
    setenv("MOE_SM90_CLUSTER", cluster.c_str(), 1);
    setenv("MOE_SM90_STAGES", stages.c_str(), 1);
    const std::string form = " (sm90, cluster " + cluster + ", " + stages + " stages)";
    const Layout l8 = make_layout(skewed_counts(8, 2400, 1), 37, 90);
    expect_product_matches_cpu(l8, Weights(8, 2 * kH, kD, 2).w, 3, "forward gate_up E=8" + form);
    expect_product_matches_cpu(l8, Weights(8, kD, kH, 4).w, 5, "forward down E=8" + form);
    expect_product_matches_cpu(make_layout(skewed_counts(64, 4000, 6), 0, 0), Weights(64, kH, kD, 7).w, 8,
                               "forward E=64 n=1024 k=2048" + form);
    expect_product_matches_cpu(make_layout({0, 0, 0, 1000, 0, 0, 0, 0}, 0, 24), Weights(8, 256, 512, 9).w, 10,
                               "forward one busy expert" + form);
    expect_product_matches_cpu(make_layout({0, 1}, 3, 5), Weights(2, 256, 256, 11).w, 12, "forward one row" + form);
    expect_product_matches_cpu(make_layout(skewed_counts(8, 2400, 21), 5, 11), Weights(8, kD, kH, 22).w_t, 23,
                               "data gradient down E=8" + form);
    const Layout lp = make_layout({130, 0, 77, 300}, 2, 3);
    expect_product_matches_cpu(lp, Weights(4, 200, 144, 31).w, 32, "forward n=200 k=144" + form);
    expect_product_matches_cpu(lp, Weights(4, 256, 112, 34).w, 35, "forward n=256 k=112" + form);
    expect_product_matches_cpu(lp, Weights(4, 384, 256, 38).w, 39, "forward n=384 k=256 (three N tiles)" + form);
    expect_product_matches_cpu(lp, Weights(4, 64, 256, 40).w, 41, "forward n=64 (one N tile)" + form);
  }
#endif
}

TEST(CudaFp8Grouped, WgradAccumulatesAtModelShapes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  expect_wgrad_matches_cpu(skewed_counts(8, 2400, 41), 50, 2 * kH, kD, 0, true, 42, "wgrad gate_up E=8");
  expect_wgrad_matches_cpu(skewed_counts(8, 2400, 43), 0, kD, kH, 0, true, 44, "wgrad down E=8");
  // Columns past the capacity: the row stride of the operands and of their scales is Mp.
  expect_wgrad_matches_cpu(skewed_counts(8, 1200, 45), 0, 512, 384, 3 * kFp8Tile, true, 46, "wgrad Mp > capacity");
  expect_wgrad_matches_cpu(skewed_counts(64, 4000, 47), 0, kH, kD, 0, true, 48, "wgrad E=64");
  expect_wgrad_matches_cpu({0, 0, 0, 1000, 0, 0, 0, 0}, 0, 256, 256, 0, true, 49, "wgrad one busy expert");
#endif
}

// The first microbatch writes the gradients without reading them: every element overwritten, the
// experts without rows zeroed.
TEST(CudaFp8Grouped, WgradOverwriteZeroesEmptyExperts) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  expect_wgrad_matches_cpu(skewed_counts(8, 2400, 51), 7, 2 * kH, kD, 0, false, 52, "wgrad overwrite E=8");
  expect_wgrad_matches_cpu(std::vector<int32_t>(8, 0), 64, 256, 256, 0, false, 53, "wgrad overwrite, no rows");
  expect_wgrad_matches_cpu(std::vector<int32_t>(8, 0), 0, 256, 256, 0, false, 54, "wgrad overwrite, Mp = 896, no rows");
#endif
}

TEST(CudaFp8Grouped, CapturedGraphReplaysWithNewOffsets) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  // c = a w[e]^T and g[e] += dc_e^T x_e, captured once and replayed with offsets the capture never saw.
  const int64_t E = 8, R = 1000, K = 256, N = 384;
  const int64_t Mp = fp8_columns_capacity(R, E);
  const std::vector<std::vector<int32_t>> offset_sets = {
      {0, 100, 100, 250, 251, 400, 400, 400, 600},  // empty experts, partial tiles
      {0, 0, 0, 0, 0, 0, 0, 0, 0},                  // no rows
      {0, 0, 0, 0, 0, 0, 0, 0, 1000},               // every row in the last expert
  };
  const std::vector<float> dc = tiled_values(R, N, 63), x = tiled_values(R, K, 64), g0 = tiled_values(E, N * K, 65);
  HostFp8 a({R, K}, Fp8Tiles::Rows), dc_t({N, Mp}, Fp8Tiles::Columns), x_t({K, Mp}, Fp8Tiles::Columns);
  quantize_rows(a, tiled_values(R, K, 61));
  const Weights w(E, N, K, 62);
  quantize_columns(dc_t, dc, R, offset_sets[0]);
  quantize_columns(x_t, x, R, offset_sets[0]);
  DeviceFp8 da(a), dw(w.w), ddc(dc_t), dx(x_t);
  DeviceBuffer dcout(DType::BF16, {R, N}), dg(DType::F32, {E, N, K}), doff(DType::I32, {E + 1});
  doff.upload_i32(offset_sets[0]);
  dg.upload(g0);

  cudaStream_t stream = nullptr;  // blocking (ordered with the synchronous copies), never destroyed
  CUDA_CHECK(cudaStreamCreate(&stream));
  const Stream s{stream};
  auto step = [&] {
    fp8_grouped_matmul(dcout, da, dw, doff, s);
    fp8_grouped_matmul_wgrad(dg, ddc, dx, doff, true, s);
  };
  step();  // eager: the stream's scratch and the kernels' attributes
  CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  step();
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  for (size_t set = 0; set < offset_sets.size(); ++set) {
    const std::vector<int32_t>& off = offset_sets[set];
    quantize_columns(dc_t, dc, R, off);  // the columns operands follow the offsets
    quantize_columns(x_t, x, R, off);
    ddc.upload(dc_t);
    dx.upload(x_t);
    doff.upload_i32(off);
    dg.upload(g0);
    CUDA_CHECK(cudaMemset(dcout.tensor().data, 0xff, dcout.bytes()));  // NaN: rows outside stay NaN
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));

    const std::string what = "graph replay, offset set " + std::to_string(set);
    const std::vector<float> got_c = dcout.download(), got_g = dg.download();
    for (int64_t i = off.back() * N; i < R * N; ++i)
      ASSERT_TRUE(std::isnan(got_c[i])) << what << ": forward row " << i / N << " past the experts was written";
    expect_close(got_c, cpu_product(a, w.w, off), cpu_product_bound(a, w.w, off),
                 [&](size_t i) { return static_cast<int64_t>(i) < off.back() * N; }, kBoundTolBf16, kNormTolBf16,
                 what + " forward");

    for (int64_t e = 0; e < E; ++e) {
      if (off[e] != off[e + 1]) continue;
      for (int64_t i = e * N * K; i < (e + 1) * N * K; ++i)
        ASSERT_TRUE(same_bits(got_g[i], g0[i])) << what << ": empty expert " << e << " changed";
    }
    std::vector<float> bound_g = cpu_wgrad_bound({E, N, K}, dc_t, x_t, off);
    for (size_t i = 0; i < bound_g.size(); ++i) bound_g[i] += std::fabs(g0[i]) * 1e-4f;
    expect_close(got_g, cpu_wgrad(g0, {E, N, K}, dc_t, x_t, off, true), bound_g, [](size_t) { return true; },
                 kBoundTolF32, kNormTolF32, what + " wgrad");
  }
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
#endif
}

TEST(CudaFp8Grouped, FirstCallOnAStreamInsideCaptureIsRefused) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const int64_t E = 2, R = 16, K = 128, N = 128;
  DeviceBuffer a(DType::FP8_E4M3, {R, K}), as(DType::F32, {R, 1}), b(DType::FP8_E4M3, {E, N, K});
  DeviceBuffer bs(DType::F32, {E, 1, 1}), c(DType::BF16, {R, N}), off(DType::I32, {E + 1});
  off.upload_i32({0, 8, 16});
  cudaStream_t stream = nullptr;  // fresh and never destroyed: it has no scratch yet
  CUDA_CHECK(cudaStreamCreate(&stream));
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  EXPECT_THROW(fp8_grouped_matmul(c, {a, as, Fp8Tiles::Rows}, {b, bs, Fp8Tiles::Blocks}, off, Stream{stream}),
               Error);
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  if (graph != nullptr) CUDA_CHECK(cudaGraphDestroy(graph));
#endif
}

#if defined(MOE_HAVE_CUDA)
// fn must throw moe::Error whose message contains `expected`. A build without CUTLASS refuses every
// call for that reason instead: the test then skips.
void expect_error(const std::function<void()>& fn, const std::string& expected) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find("no CUTLASS headers") != std::string::npos) GTEST_SKIP() << msg;
    EXPECT_NE(msg.find(expected), std::string::npos) << "error was: " << msg;
    return;
  }
  ADD_FAILURE() << "no error; expected one containing \"" << expected << "\"";
}

// Device tensors that are never dereferenced: the host checks run before any device call.
Tensor fake(DType dtype, Shape shape, uintptr_t address = 256) {
  return Tensor(reinterpret_cast<void*>(address), dtype, shape, Device::CUDA);
}
#endif

// What the kernels cannot take is refused on the host with the reason (no GPU needed).
TEST(CudaFp8Grouped, UnsupportedShapesAreRefusedWithTheReason) {
#if defined(MOE_HAVE_CUDA)
  const int64_t E = 2, R = 64;
  auto product = [&](int64_t n, int64_t k, DType c_dtype, uintptr_t a_address) {
    return [=] {
      fp8_grouped_matmul(fake(c_dtype, {R, n}),
                         {fake(DType::FP8_E4M3, {R, k}, a_address), fake(DType::F32, {R, tiles(k)}), Fp8Tiles::Rows},
                         {fake(DType::FP8_E4M3, {E, n, k}), fake(DType::F32, {E, tiles(n), tiles(k)}),
                          Fp8Tiles::Blocks},
                         fake(DType::I32, {E + 1}), {});
    };
  };
  expect_error(product(128, 72, DType::BF16, 256), "not a multiple of 16");
  expect_error(product(100, 128, DType::BF16, 256), "not a multiple of 8");
  expect_error(product(128, 128, DType::F32, 256), "BF16");
  expect_error(product(128, 128, DType::BF16, 264), "a.codes is not 16-byte aligned");
  auto wgrad = [&](int64_t experts, int64_t n, int64_t k, int64_t columns) {
    return [=] {
      fp8_grouped_matmul_wgrad(
          fake(DType::F32, {experts, n, k}),
          {fake(DType::FP8_E4M3, {n, columns}), fake(DType::F32, {tiles(columns), n}), Fp8Tiles::Columns},
          {fake(DType::FP8_E4M3, {k, columns}), fake(DType::F32, {tiles(columns), k}), Fp8Tiles::Columns},
          fake(DType::I32, {experts + 1}), true, {});
    };
  };
  expect_error(wgrad(E, 128, 128, 200), "not a multiple of 16");
  expect_error(wgrad(E, 128, 130, 256), "not a multiple of 4");
  expect_error(wgrad(1025, 128, 128, 256), "1025 experts exceed the 1024");
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

// MOE_BENCH=1: ms and TFLOP/s of the six FP8 expert products at the bench-olmoe-4l shapes (64
// experts, 32768 x 8 rows, d 2048, h 1024, even load). Values do not matter (all codes 1.0).
TEST(CudaFp8Grouped, TimingAtBenchShapes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  MOE_SKIP_UNLESS_BENCH("timing");
  const int64_t E = 64, rows = 32768 * 8, Mp = fp8_columns_capacity(rows, E), D = kD, H = kH;
  DeviceBuffer in(DType::FP8_E4M3, {rows, 2 * H}), in_s(DType::F32, {rows, tiles(2 * H)});
  DeviceBuffer w(DType::FP8_E4M3, {E, 2 * H, D}), w_s(DType::F32, {E, tiles(2 * H), tiles(D)});
  DeviceBuffer cols_a(DType::FP8_E4M3, {2 * H, Mp}), cols_a_s(DType::F32, {tiles(Mp), 2 * H});
  DeviceBuffer cols_b(DType::FP8_E4M3, {2 * H, Mp}), cols_b_s(DType::F32, {tiles(Mp), 2 * H});
  DeviceBuffer out(DType::BF16, {rows, 2 * H}), g(DType::F32, {E, 2 * H, D}), off(DType::I32, {E + 1});
  for (const DeviceBuffer* b : {&in, &w, &cols_a, &cols_b}) CUDA_CHECK(cudaMemset(b->tensor().data, 0x38, b->bytes()));
  for (const DeviceBuffer* b : {&in_s, &w_s, &cols_a_s, &cols_b_s}) {
    const std::vector<float> ones(b->bytes() / sizeof(float), 1.0f);
    CUDA_CHECK(cudaMemcpy(b->tensor().data, ones.data(), b->bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<int32_t> offsets{0};
  for (int64_t e = 0; e < E; ++e) offsets.push_back(static_cast<int32_t>(rows / E * (e + 1)));
  off.upload_i32(offsets);
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  const Stream s{stream};
  struct Product {
    const char* name;
    bool wgrad;
    int64_t n_out, k_in;
    bool accumulate;  // wgrad: += (several microbatches) or = (one, as bench-olmoe-4l)
  };
  const Product products[] = {
      {"fwd gate_up  x.Wgu^T", false, 2 * H, D, false},   {"fwd down     a.Wd^T", false, D, H, false},
      {"dgrad down   dy.Wd", false, H, D, false},         {"dgrad gate_up dgu.Wgu", false, D, 2 * H, false},
      {"wgrad down   dy^T.a +=", true, D, H, true},       {"wgrad gate_up dgu^T.x +=", true, 2 * H, D, true},
      {"wgrad down   dy^T.a =", true, D, H, false},       {"wgrad gate_up dgu^T.x =", true, 2 * H, D, false},
  };
  std::printf("FP8 grouped GEMM timing, 64 experts x %lld rows (BF16 out; wgrad F32 += and =)\n",
              static_cast<long long>(rows / E));
  double total_ms = 0, total_flop = 0;  // the six products of one layer (the weight gradients' +=)
  for (const Product& p : products) {
    auto run = [&] {
      if (p.wgrad) {
        fp8_grouped_matmul_wgrad(front(g, DType::F32, {E, p.n_out, p.k_in}),
                                 {front(cols_a, DType::FP8_E4M3, {p.n_out, Mp}),
                                  front(cols_a_s, DType::F32, {tiles(Mp), p.n_out}), Fp8Tiles::Columns},
                                 {front(cols_b, DType::FP8_E4M3, {p.k_in, Mp}),
                                  front(cols_b_s, DType::F32, {tiles(Mp), p.k_in}), Fp8Tiles::Columns},
                                 off, p.accumulate, s);
      } else {
        fp8_grouped_matmul(front(out, DType::BF16, {rows, p.n_out}),
                           {front(in, DType::FP8_E4M3, {rows, p.k_in}), front(in_s, DType::F32, {rows, tiles(p.k_in)}),
                            Fp8Tiles::Rows},
                           {front(w, DType::FP8_E4M3, {E, p.n_out, p.k_in}),
                            front(w_s, DType::F32, {E, tiles(p.n_out), tiles(p.k_in)}), Fp8Tiles::Blocks},
                           off, s);
      }
    };
    const double flop = 2.0 * static_cast<double>(rows) * p.n_out * p.k_in;
    const double ms = time_ms(run, stream, 3, 20);
    if (!p.wgrad || p.accumulate) total_ms += ms, total_flop += flop;
    std::printf("  %-22s %9.3f ms %9.1f TFLOP/s\n", p.name, ms, flop / ms * 1e-9);
  }
  std::printf("  %-22s %9.3f ms %9.1f TFLOP/s\n", "all six (one layer)", total_ms, total_flop / total_ms * 1e-9);
#endif
}

}  // namespace
}  // namespace moe

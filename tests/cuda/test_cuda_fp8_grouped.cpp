// cuda::fp8_grouped_matmul / fp8_grouped_matmul_wgrad (CUTLASS's Hopper grouped GEMM with blockwise
// scaling) against the FP32 CPU products (ops/grouped_gemm.h) of the dequantized operands, with the
// per-expert offsets only on the device. Operands are quantized on the host with moe/core/fp8.h
// (the scalar code every FP8 quantizer shares) into the tile layouts of moe/ops/fp8.h: Rows
// activations, Blocks weights and their transposed cache (the data gradient), and the transposed
// segmented columns operands of the weight gradient. Values carry a random power-of-two magnitude
// per row and per 128-column block, so every tile gets its own scale and a scale read from the
// wrong tile shows.
//
// Tolerances, per element, relative to the sum of |a||b| over the contraction (the error scale of a
// dot product): BF16 output (forward, data gradient) <= 4e-3 (BF16 rounding alone is up to 2^-9 of
// |c|, plus the FP8 tensor cores' accumulation inside each 128-deep slice), F32 output (weight
// gradient) <= 1e-3; normalized error ||got - ref|| / ||ref|| <= 5e-3 and 1e-3. The CPU sums the
// same products in FP32 (exact products: E4M3 x E4M3 with power-of-two scales), so the difference
// is summation order and the GPU's accumulation. Rows outside the experts and experts without rows
// must be bit-exact (untouched, or zeros when the weight gradient overwrites).
//
// The error tests run without a GPU (the host checks come before any device call). MOE_BENCH=1
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
#include "moe/ops/grouped_gemm.h"
#if defined(MOE_HAVE_CUDA)
#include "moe/ops/cuda/fp8.h"
#endif

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;

constexpr int64_t kTile = 128;
constexpr double kBoundTolBf16 = 4e-3, kNormTolBf16 = 5e-3;
constexpr double kBoundTolF32 = 1e-3, kNormTolF32 = 1e-3;

int64_t tiles(int64_t n) { return (n + kTile - 1) / kTile; }
int64_t round_up(int64_t n) { return tiles(n) * kTile; }
bool same_bits(float x, float y) { return std::memcmp(&x, &y, sizeof(float)) == 0; }

// Uniform(-1, 1) times 2^(r_i + c_j), r per row and c per 128-column block in [-3, 3].
std::vector<float> tiled_values(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> mag(-3, 3);
  std::vector<int> row_mag(static_cast<size_t>(rows)), col_mag(static_cast<size_t>(tiles(cols)));
  for (int& m : row_mag) m = mag(rng);
  for (int& m : col_mag) m = mag(rng);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) v[r * cols + c] = std::ldexp(u(rng), row_mag[r] + col_mag[c / kTile]);
  return v;
}

// Host FP8 operands: E4M3 codes and F32 scales in moe/ops/fp8.h's layouts.
struct HostFp8 {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

// The scale of the values at v[0], v[stride], ... (n of them) and their codes into `codes`.
float quantize_tile(const float* v, int64_t n, int64_t stride, uint8_t* codes, int64_t code_stride) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[i * stride]));
  const float scale = fp8::tile_scale(amax);
  for (int64_t i = 0; i < n; ++i) codes[i * code_stride] = fp8::quantize_with_scale(v[i * stride], scale);
  return scale;
}

// x [M, K] -> Rows tiles: scales [M, tiles(K)].
HostFp8 quantize_rows(const std::vector<float>& x, int64_t M, int64_t K) {
  HostFp8 q{std::vector<uint8_t>(static_cast<size_t>(M * K)), std::vector<float>(static_cast<size_t>(M * tiles(K)))};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < tiles(K); ++j) {
      const int64_t k0 = j * kTile, n = std::min(kTile, K - k0);
      q.scales[m * tiles(K) + j] = quantize_tile(&x[m * K + k0], n, 1, &q.codes[m * K + k0], 1);
    }
  return q;
}

// w [E, N, K] -> Blocks tiles: scales [E, tiles(N), tiles(K)].
HostFp8 quantize_blocks(const std::vector<float>& w, int64_t E, int64_t N, int64_t K) {
  HostFp8 q{std::vector<uint8_t>(w.size()), std::vector<float>(static_cast<size_t>(E * tiles(N) * tiles(K)))};
  for (int64_t e = 0; e < E; ++e)
    for (int64_t bn = 0; bn < tiles(N); ++bn)
      for (int64_t bk = 0; bk < tiles(K); ++bk) {
        const int64_t n0 = bn * kTile, k0 = bk * kTile, nn = std::min(kTile, N - n0), nk = std::min(kTile, K - k0);
        float amax = 0;
        for (int64_t n = n0; n < n0 + nn; ++n)
          for (int64_t k = k0; k < k0 + nk; ++k) amax = std::max(amax, std::fabs(w[(e * N + n) * K + k]));
        const float scale = fp8::tile_scale(amax);
        q.scales[(e * tiles(N) + bn) * tiles(K) + bk] = scale;
        for (int64_t n = n0; n < n0 + nn; ++n)
          for (int64_t k = k0; k < k0 + nk; ++k)
            q.codes[(e * N + n) * K + k] = fp8::quantize_with_scale(w[(e * N + n) * K + k], scale);
      }
  return q;
}

// w [E, N, K] -> w^T [E, K, N] (the data gradient's weights).
std::vector<float> transpose_experts(const std::vector<float>& w, int64_t E, int64_t N, int64_t K) {
  std::vector<float> t(w.size());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) t[(e * K + k) * N + n] = w[(e * N + n) * K + k];
  return t;
}

// Segment starts p_g (moe/ops/fp8.h): the sum of round_up(M_g', 128) over g' < g.
std::vector<int64_t> segment_starts(const std::vector<int32_t>& offsets) {
  std::vector<int64_t> p{0};
  for (size_t g = 0; g + 1 < offsets.size(); ++g) p.push_back(p.back() + round_up(offsets[g + 1] - offsets[g]));
  return p;
}

// x [M, K] -> columns: codes [K, Mp], Rows tiles along Mp (scales [K, tiles(Mp)]), expert g's rows
// at columns p_g + (r - o_g); padding columns code 0 (scale of an all-zero tile: 1).
HostFp8 quantize_columns(const std::vector<float>& x, int64_t K, const std::vector<int32_t>& offsets, int64_t Mp) {
  HostFp8 q{std::vector<uint8_t>(static_cast<size_t>(K * Mp), 0),
            std::vector<float>(static_cast<size_t>(K * tiles(Mp)), 1.0f)};
  const std::vector<int64_t> p = segment_starts(offsets);
  for (size_t g = 0; g + 1 < offsets.size(); ++g)
    for (int64_t r0 = offsets[g]; r0 < offsets[g + 1]; r0 += kTile) {
      const int64_t n = std::min<int64_t>(kTile, offsets[g + 1] - r0), col = p[g] + (r0 - offsets[g]);
      for (int64_t k = 0; k < K; ++k)
        q.scales[k * tiles(Mp) + col / kTile] = quantize_tile(&x[r0 * K + k], n, K, &q.codes[k * Mp + col], 1);
    }
  return q;
}

// The values codes stand for, with a tile's scale from scale_index(row, col).
std::vector<float> dequantize(const HostFp8& q, const std::function<int64_t(int64_t)>& scale_index) {
  std::vector<float> v(q.codes.size());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = fp8::e4m3_to_f32(q.codes[i]) * q.scales[static_cast<size_t>(scale_index(static_cast<int64_t>(i)))];
  return v;
}
std::vector<float> dequantize_rows(const HostFp8& q, int64_t K) {
  return dequantize(q, [K](int64_t i) { return i / K * tiles(K) + i % K / kTile; });
}
std::vector<float> dequantize_blocks(const HostFp8& q, int64_t N, int64_t K) {
  return dequantize(q, [N, K](int64_t i) {
    const int64_t e = i / (N * K), n = i / K % N, k = i % K;
    return (e * tiles(N) + n / kTile) * tiles(K) + k / kTile;
  });
}
// The columns' values back at their rows: [M, K] (rows outside the segments zero).
std::vector<float> dequantize_columns_to_rows(const HostFp8& q, int64_t M, int64_t K,
                                              const std::vector<int32_t>& offsets, int64_t Mp) {
  const std::vector<float> cols = dequantize_rows(q, Mp);  // [K, Mp] as Rows tiles
  const std::vector<int64_t> p = segment_starts(offsets);
  std::vector<float> x(static_cast<size_t>(M * K), 0.0f);
  for (size_t g = 0; g + 1 < offsets.size(); ++g)
    for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r)
      for (int64_t k = 0; k < K; ++k) x[r * K + k] = cols[k * Mp + p[g] + (r - offsets[g])];
  return x;
}

std::vector<float> abs_values(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

// An FP8 operand on the device.
struct DeviceFp8 {
  DeviceBuffer codes, scales;
  Fp8Tiles tiles;
  DeviceFp8(const HostFp8& h, Shape codes_shape, Shape scales_shape, Fp8Tiles t)
      : codes(DType::FP8_E4M3, codes_shape), scales(DType::F32, scales_shape), tiles(t) {
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
// error; returns the normalized error (+inf on a failure, reported once with the worst element).
double expect_close(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<float>& bound,
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
  return bad == 0 ? err : INFINITY;
}

// c = a * b[e]^T per expert: a Rows (from a_values [rows, k_in]), b Blocks (b_values [E, n_out, k_in]).
// Rows outside [o_0, o_E) of a hold NaN codes and scales (never read); of c, stay NaN (never written).
void expect_product_matches_cpu(const Layout& l, const std::vector<float>& b_values, int64_t n_out, int64_t k_in,
                                uint32_t seed, const std::string& what) {
  const int64_t E = static_cast<int64_t>(l.offsets.size()) - 1, rows = l.rows;
  const int64_t first = l.offsets.front(), last = l.offsets.back();
  HostFp8 qa = quantize_rows(tiled_values(rows, k_in, seed), rows, k_in);
  for (int64_t r = 0; r < rows; ++r)
    if (r < first || r >= last) {
      std::fill_n(&qa.codes[r * k_in], k_in, fp8::kE4m3NanCode);
      std::fill_n(&qa.scales[r * tiles(k_in)], tiles(k_in), std::numeric_limits<float>::quiet_NaN());
    }
  const HostFp8 qb = quantize_blocks(b_values, E, n_out, k_in);

  std::vector<float> a = dequantize_rows(qa, k_in), b = dequantize_blocks(qb, n_out, k_in);
  for (int64_t r = 0; r < rows; ++r)
    if (r < first || r >= last) std::fill_n(&a[r * k_in], k_in, 0.0f);  // the CPU skips them too
  std::vector<float> ref(static_cast<size_t>(rows * n_out), 0.0f), bound = ref;
  std::vector<int32_t> offsets = l.offsets;
  std::vector<float> abs_a = abs_values(a), abs_b = abs_values(b);
  grouped_matmul(f32_tensor(ref.data(), {rows, n_out}), f32_tensor(a.data(), {rows, k_in}),
                 f32_tensor(b.data(), {E, n_out, k_in}), i32_tensor(offsets.data(), {E + 1}), true, false);
  grouped_matmul(f32_tensor(bound.data(), {rows, n_out}), f32_tensor(abs_a.data(), {rows, k_in}),
                 f32_tensor(abs_b.data(), {E, n_out, k_in}), i32_tensor(offsets.data(), {E + 1}), true, false);

  DeviceFp8 da(qa, {rows, k_in}, {rows, tiles(k_in)}, Fp8Tiles::Rows);
  DeviceFp8 db(qb, {E, n_out, k_in}, {E, tiles(n_out), tiles(k_in)}, Fp8Tiles::Blocks);
  DeviceBuffer dc(DType::BF16, {rows, n_out}), doff(DType::I32, {E + 1});  // c poisoned: NaN
  doff.upload_i32(l.offsets);
  cuda::fp8_grouped_matmul(dc, da, db, doff, {});
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

// db[e] (+)= dc_e^T x_e from the columns operands of dc [M, n_out] and x [M, k_in] quantized with
// offsets (offsets[0] = 0; rows past offsets[E] belong to no expert), Mp = the capacity plus
// `extra_columns`. accumulate = false starts db as NaN, which every element must overwrite.
void expect_wgrad_matches_cpu(const std::vector<int32_t>& counts, int32_t tail, int64_t n_out, int64_t k_in,
                              int64_t extra_columns, bool accumulate, uint32_t seed, const std::string& what) {
  const Layout l = make_layout(counts, 0, tail);
  const int64_t E = static_cast<int64_t>(counts.size()), M = l.rows;
  const int64_t Mp = round_up(M) + kTile * (E - 1) + extra_columns;  // fp8_columns_capacity(M, E) + extra
  const std::vector<float> dc = tiled_values(M, n_out, seed), x = tiled_values(M, k_in, seed + 1);
  const HostFp8 qdc = quantize_columns(dc, n_out, l.offsets, Mp), qx = quantize_columns(x, k_in, l.offsets, Mp);
  std::vector<float> dc_deq = dequantize_columns_to_rows(qdc, M, n_out, l.offsets, Mp);
  std::vector<float> x_deq = dequantize_columns_to_rows(qx, M, k_in, l.offsets, Mp);

  std::mt19937 rng(seed + 2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> db0(static_cast<size_t>(E * n_out * k_in));
  for (float& v : db0) v = accumulate ? u(rng) : std::numeric_limits<float>::quiet_NaN();
  std::vector<float> ref = accumulate ? db0 : std::vector<float>(db0.size(), 0.0f);
  std::vector<float> bound(db0.size(), 0.0f);
  std::vector<int32_t> offsets = l.offsets;
  std::vector<float> abs_dc = abs_values(dc_deq), abs_x = abs_values(x_deq);
  grouped_matmul_wgrad(f32_tensor(ref.data(), {E, n_out, k_in}), f32_tensor(dc_deq.data(), {M, n_out}),
                       f32_tensor(x_deq.data(), {M, k_in}), i32_tensor(offsets.data(), {E + 1}));
  grouped_matmul_wgrad(f32_tensor(bound.data(), {E, n_out, k_in}), f32_tensor(abs_dc.data(), {M, n_out}),
                       f32_tensor(abs_x.data(), {M, k_in}), i32_tensor(offsets.data(), {E + 1}));
  if (accumulate)  // the FP32 add of db0 rounds at 2^-24 of |db0|
    for (size_t i = 0; i < bound.size(); ++i) bound[i] += std::fabs(db0[i]) * 1e-4f;

  DeviceFp8 ddc(qdc, {n_out, Mp}, {n_out, tiles(Mp)}, Fp8Tiles::Rows);
  DeviceFp8 dx(qx, {k_in, Mp}, {k_in, tiles(Mp)}, Fp8Tiles::Rows);
  DeviceBuffer ddb(DType::F32, {E, n_out, k_in}), doff(DType::I32, {E + 1});
  ddb.upload(db0);
  doff.upload_i32(l.offsets);
  cuda::fp8_grouped_matmul_wgrad(ddb, ddc, dx, doff, accumulate, {});
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
  expect_product_matches_cpu(l8, tiled_values(8 * 2 * kH, kD, 2), 2 * kH, kD, 3, "forward gate_up E=8");
  expect_product_matches_cpu(l8, tiled_values(8 * kD, kH, 4), kD, kH, 5, "forward down E=8");
  // 64 experts, many small or empty.
  const Layout l64 = make_layout(skewed_counts(64, 4000, 6), 0, 0);
  expect_product_matches_cpu(l64, tiled_values(64 * kH, kD, 7), kH, kD, 8, "forward E=64 n=1024 k=2048");
  // Every row in one expert, and one row in total.
  expect_product_matches_cpu(make_layout({0, 0, 0, 1000, 0, 0, 0, 0}, 0, 24), tiled_values(8 * 256, 512, 9), 256,
                             512, 10, "forward one busy expert");
  expect_product_matches_cpu(make_layout({0, 1}, 3, 5), tiled_values(2 * 256, 256, 11), 256, 256, 12,
                             "forward one row");
#endif
}

// The data gradient runs the same product on the weights' transposed Blocks cache, whose tiles are
// the forward cache's tiles transposed (the same scales).
TEST(CudaFp8Grouped, DataGradientWithTransposedCacheMatchesCpu) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const int64_t E = 8;
  const Layout l = make_layout(skewed_counts(E, 2400, 21), 5, 11);
  // down: w [E, d, h]; dx [rows, h] = dy [rows, d] w[e]: b = w^T [E, h, d].
  const std::vector<float> w_down = tiled_values(E * kD, kH, 22);
  const std::vector<float> w_down_t = transpose_experts(w_down, E, kD, kH);
  const std::vector<float> fwd = dequantize_blocks(quantize_blocks(w_down, E, kD, kH), kD, kH);
  const std::vector<float> bwd = dequantize_blocks(quantize_blocks(w_down_t, E, kH, kD), kH, kD);
  ASSERT_EQ(transpose_experts(fwd, E, kD, kH), bwd) << "the transposed cache must hold the same values";
  expect_product_matches_cpu(l, w_down_t, kH, kD, 23, "data gradient down E=8");
  // gate_up: w [E, 2h, d]; dx [rows, d] = dgu [rows, 2h] w[e]: b = w^T [E, d, 2h].
  expect_product_matches_cpu(l, transpose_experts(tiled_values(E * 2 * kH, kD, 24), E, 2 * kH, kD), kD, 2 * kH, 25,
                             "data gradient gate_up E=8");
#endif
}

// Dims that are not multiples of 128: partial scale tiles at the edges of K and N.
TEST(CudaFp8Grouped, PartialTilesMatchCpu) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const Layout l = make_layout({130, 0, 77, 300}, 2, 3);
  expect_product_matches_cpu(l, tiled_values(4 * 200, 144, 31), 200, 144, 32, "forward n=200 k=144");
  expect_wgrad_matches_cpu({130, 0, 77, 300}, 9, 200, 144, 0, true, 33, "wgrad n=200 k=144");
#endif
}

TEST(CudaFp8Grouped, WgradAccumulatesAtModelShapes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  expect_wgrad_matches_cpu(skewed_counts(8, 2400, 41), 50, 2 * kH, kD, 0, true, 42, "wgrad gate_up E=8");
  expect_wgrad_matches_cpu(skewed_counts(8, 2400, 43), 0, kD, kH, 0, true, 44, "wgrad down E=8");
  // Columns past the capacity: the row stride of the operands and of their scales is Mp.
  expect_wgrad_matches_cpu(skewed_counts(8, 1200, 45), 0, 512, 384, 3 * kTile, true, 46, "wgrad Mp > capacity");
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
  const int64_t Mp = round_up(R) + kTile * (E - 1);
  const std::vector<std::vector<int32_t>> offset_sets = {
      {0, 100, 100, 250, 251, 400, 400, 400, 600},  // empty experts, partial tiles
      {0, 0, 0, 0, 0, 0, 0, 0, 0},                  // no rows
      {0, 0, 0, 0, 0, 0, 0, 0, 1000},               // every row in the last expert
  };
  const std::vector<float> a = tiled_values(R, K, 61), w = tiled_values(E * N, K, 62);
  const std::vector<float> dc = tiled_values(R, N, 63), x = tiled_values(R, K, 64);
  std::vector<float> g0 = tiled_values(E, N * K, 65);
  const HostFp8 qa = quantize_rows(a, R, K), qw = quantize_blocks(w, E, N, K);
  DeviceFp8 da(qa, {R, K}, {R, tiles(K)}, Fp8Tiles::Rows), dw(qw, {E, N, K}, {E, tiles(N), tiles(K)}, Fp8Tiles::Blocks);
  // The columns operands depend on the offsets: quantized again for every offset set below.
  DeviceFp8 ddc(quantize_columns(dc, N, offset_sets[0], Mp), {N, Mp}, {N, tiles(Mp)}, Fp8Tiles::Rows);
  DeviceFp8 dx(quantize_columns(x, K, offset_sets[0], Mp), {K, Mp}, {K, tiles(Mp)}, Fp8Tiles::Rows);
  DeviceBuffer dcout(DType::BF16, {R, N}), dg(DType::F32, {E, N, K}), doff(DType::I32, {E + 1});
  doff.upload_i32(offset_sets[0]);
  dg.upload(g0);

  cudaStream_t stream = nullptr;  // blocking (ordered with the synchronous copies), never destroyed
  CUDA_CHECK(cudaStreamCreate(&stream));
  const Stream s{stream};
  auto step = [&] {
    cuda::fp8_grouped_matmul(dcout, da, dw, doff, s);
    cuda::fp8_grouped_matmul_wgrad(dg, ddc, dx, doff, true, s);
  };
  step();  // eager: the stream's scratch and the kernels' attributes
  CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  step();
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  const std::vector<float> a_deq = dequantize_rows(qa, K), w_deq = dequantize_blocks(qw, N, K);
  for (size_t set = 0; set < offset_sets.size(); ++set) {
    std::vector<int32_t> off = offset_sets[set];
    const HostFp8 qdc = quantize_columns(dc, N, off, Mp), qx = quantize_columns(x, K, off, Mp);
    ddc.upload(qdc);
    dx.upload(qx);
    doff.upload_i32(off);
    dg.upload(g0);
    CUDA_CHECK(cudaMemset(dcout.tensor().data, 0xff, dcout.bytes()));  // NaN: rows outside stay NaN
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));

    const std::string what = "graph replay, offset set " + std::to_string(set);
    std::vector<float> ref_c(static_cast<size_t>(R * N), 0.0f), bound_c = ref_c;
    std::vector<float> a_in = a_deq, w_in = w_deq, abs_a = abs_values(a_deq), abs_w = abs_values(w_deq);
    grouped_matmul(f32_tensor(ref_c.data(), {R, N}), f32_tensor(a_in.data(), {R, K}),
                   f32_tensor(w_in.data(), {E, N, K}), i32_tensor(off.data(), {E + 1}), true, false);
    grouped_matmul(f32_tensor(bound_c.data(), {R, N}), f32_tensor(abs_a.data(), {R, K}),
                   f32_tensor(abs_w.data(), {E, N, K}), i32_tensor(off.data(), {E + 1}), true, false);
    const std::vector<float> got_c = dcout.download();
    for (int64_t i = off.back() * N; i < R * N; ++i)
      ASSERT_TRUE(std::isnan(got_c[i])) << what << ": forward row " << i / N << " past the experts was written";
    expect_close(got_c, ref_c, bound_c, [&](size_t i) { return static_cast<int64_t>(i) < off.back() * N; },
                 kBoundTolBf16, kNormTolBf16, what + " forward");

    std::vector<float> dc_deq = dequantize_columns_to_rows(qdc, R, N, off, Mp);
    std::vector<float> x_deq = dequantize_columns_to_rows(qx, R, K, off, Mp);
    std::vector<float> ref_g = g0, bound_g(g0.size(), 0.0f), abs_dc = abs_values(dc_deq), abs_x = abs_values(x_deq);
    grouped_matmul_wgrad(f32_tensor(ref_g.data(), {E, N, K}), f32_tensor(dc_deq.data(), {R, N}),
                         f32_tensor(x_deq.data(), {R, K}), i32_tensor(off.data(), {E + 1}));
    grouped_matmul_wgrad(f32_tensor(bound_g.data(), {E, N, K}), f32_tensor(abs_dc.data(), {R, N}),
                         f32_tensor(abs_x.data(), {R, K}), i32_tensor(off.data(), {E + 1}));
    for (size_t i = 0; i < bound_g.size(); ++i) bound_g[i] += std::fabs(g0[i]) * 1e-4f;
    const std::vector<float> got_g = dg.download();
    for (int64_t e = 0; e < E; ++e) {
      if (off[e] != off[e + 1]) continue;
      for (int64_t i = e * N * K; i < (e + 1) * N * K; ++i)
        ASSERT_TRUE(same_bits(got_g[i], g0[i])) << what << ": empty expert " << e << " changed";
    }
    expect_close(got_g, ref_g, bound_g, [](size_t) { return true; }, kBoundTolF32, kNormTolF32, what + " wgrad");
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
  EXPECT_THROW(cuda::fp8_grouped_matmul(c, {a, as, Fp8Tiles::Rows}, {b, bs, Fp8Tiles::Blocks}, off, Stream{stream}),
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
      cuda::fp8_grouped_matmul(fake(c_dtype, {R, n}),
                               {fake(DType::FP8_E4M3, {R, k}, a_address), fake(DType::F32, {R, tiles(k)}),
                                Fp8Tiles::Rows},
                               {fake(DType::FP8_E4M3, {E, n, k}), fake(DType::F32, {E, tiles(n), tiles(k)}),
                                Fp8Tiles::Blocks},
                               fake(DType::I32, {E + 1}), {});
    };
  };
  expect_error(product(128, 72, DType::BF16, 256), "not a multiple of 16");
  expect_error(product(100, 128, DType::BF16, 256), "not a multiple of 8");
  expect_error(product(128, 128, DType::F32, 256), "BF16");
  expect_error(product(128, 128, DType::BF16, 264), "a.codes is not 16-byte aligned");
  auto wgrad = [&](int64_t experts, int64_t n, int64_t k, int64_t columns, DType db_dtype) {
    return [=] {
      cuda::fp8_grouped_matmul_wgrad(
          fake(db_dtype, {experts, n, k}),
          {fake(DType::FP8_E4M3, {n, columns}), fake(DType::F32, {n, tiles(columns)}), Fp8Tiles::Rows},
          {fake(DType::FP8_E4M3, {k, columns}), fake(DType::F32, {k, tiles(columns)}), Fp8Tiles::Rows},
          fake(DType::I32, {experts + 1}), true, {});
    };
  };
  expect_error(wgrad(E, 128, 128, 200, DType::F32), "not a multiple of 16");
  expect_error(wgrad(E, 128, 130, 256, DType::F32), "not a multiple of 4");
  expect_error(wgrad(E, 128, 128, 256, DType::BF16), "F32");
  expect_error(wgrad(1025, 128, 128, 256, DType::F32), "1025 experts exceed the 1024");
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

#if defined(MOE_HAVE_CUDA)
double time_ms(const std::function<void()>& fn, cudaStream_t stream, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) fn();
  CUDA_CHECK(cudaEventRecord(stop, stream));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return ms / iters;
}

Tensor front(const DeviceBuffer& b, DType dtype, Shape shape) {
  EXPECT_LE(static_cast<size_t>(shape.numel()) * dtype_size(dtype), b.bytes());
  return Tensor(b.tensor().data, dtype, shape, Device::CUDA);
}
#endif

// MOE_BENCH=1: ms and TFLOP/s of the six FP8 expert products at the bench-olmoe-4l shapes (64
// experts, 32768 x 8 rows, d 2048, h 1024, even load). Values do not matter (all codes 1.0).
TEST(CudaFp8Grouped, TimingAtBenchShapes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const char* bench = std::getenv("MOE_BENCH");
  if (bench == nullptr || std::string(bench) != "1") GTEST_SKIP() << "timing runs with MOE_BENCH=1";
  const int64_t E = 64, rows = 32768 * 8, Mp = rows + kTile * (E - 1), D = kD, H = kH;
  DeviceBuffer in(DType::FP8_E4M3, {rows, 2 * H}), in_s(DType::F32, {rows, tiles(2 * H)});
  DeviceBuffer w(DType::FP8_E4M3, {E, 2 * H, D}), w_s(DType::F32, {E, tiles(2 * H), tiles(D)});
  DeviceBuffer cols_a(DType::FP8_E4M3, {2 * H, Mp}), cols_a_s(DType::F32, {2 * H, tiles(Mp)});
  DeviceBuffer cols_b(DType::FP8_E4M3, {2 * H, Mp}), cols_b_s(DType::F32, {2 * H, tiles(Mp)});
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
  };
  const Product products[] = {
      {"fwd gate_up  x.Wgu^T", false, 2 * H, D}, {"fwd down     a.Wd^T", false, D, H},
      {"dgrad down   dy.Wd", false, H, D},       {"dgrad gate_up dgu.Wgu", false, D, 2 * H},
      {"wgrad down   dy^T.a", true, D, H},       {"wgrad gate_up dgu^T.x", true, 2 * H, D},
  };
  std::printf("FP8 grouped GEMM timing, 64 experts x %lld rows (BF16 out; wgrad F32 +=)\n",
              static_cast<long long>(rows / E));
  double total_ms = 0, total_flop = 0;
  for (const Product& p : products) {
    auto run = [&] {
      if (p.wgrad) {
        cuda::fp8_grouped_matmul_wgrad(front(g, DType::F32, {E, p.n_out, p.k_in}),
                                       {front(cols_a, DType::FP8_E4M3, {p.n_out, Mp}),
                                        front(cols_a_s, DType::F32, {p.n_out, tiles(Mp)}), Fp8Tiles::Rows},
                                       {front(cols_b, DType::FP8_E4M3, {p.k_in, Mp}),
                                        front(cols_b_s, DType::F32, {p.k_in, tiles(Mp)}), Fp8Tiles::Rows},
                                       off, true, s);
      } else {
        cuda::fp8_grouped_matmul(front(out, DType::BF16, {rows, p.n_out}),
                                 {front(in, DType::FP8_E4M3, {rows, p.k_in}),
                                  front(in_s, DType::F32, {rows, tiles(p.k_in)}), Fp8Tiles::Rows},
                                 {front(w, DType::FP8_E4M3, {E, p.n_out, p.k_in}),
                                  front(w_s, DType::F32, {E, tiles(p.n_out), tiles(p.k_in)}), Fp8Tiles::Blocks},
                                 off, s);
      }
    };
    const double flop = 2.0 * static_cast<double>(rows) * p.n_out * p.k_in;
    const double ms = time_ms(run, stream, 3, 20);
    total_ms += ms;
    total_flop += flop;
    std::printf("  %-22s %9.3f ms %9.1f TFLOP/s\n", p.name, ms, flop / ms * 1e-9);
  }
  std::printf("  %-22s %9.3f ms %9.1f TFLOP/s\n", "all six (one layer)", total_ms, total_flop / total_ms * 1e-9);
#endif
}

}  // namespace
}  // namespace moe

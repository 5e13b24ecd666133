// The FP8 products on the CPU (moe/ops/fp8.h) against FP64 naive products of the dequantized
// operands: within 1e-5 of the sum of |a||b| terms (the FP32 summation), with accumulate, empty
// experts, spare rows and the columns operands of the weight gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "moe/core/rng.h"
#include "moe/ops/fp8.h"

namespace moe {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = -12345.0f;

std::vector<float> random_vec(int64_t n, uint64_t seed, double spread = 1.0) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(rng.normal() * spread);
  return v;
}

// A quantized operand with its dequantized values (the exact numbers the product multiplies).
struct Operand {
  std::vector<uint8_t> codes;
  std::vector<float> scales, values;
  Fp8Tensor t;
  Operand(Shape shape, Fp8Tiles tiles)
      : codes(static_cast<size_t>(shape.numel())),
        scales(static_cast<size_t>(fp8_scale_shape(shape, tiles).numel())),
        values(codes.size()) {
    t = {Tensor(codes.data(), DType::FP8_E4M3, shape), f32_tensor(scales.data(), fp8_scale_shape(shape, tiles)),
         tiles};
  }
  void dequantize() { fp8_dequantize(f32_tensor(values.data(), t.codes.shape), t); }
};

Operand rows_of(std::vector<float>& x, int64_t M, int64_t K) {
  Operand q({M, K}, Fp8Tiles::Rows);
  fp8_quantize_rows(q.t, f32_tensor(x.data(), {M, K}));
  q.dequantize();
  return q;
}

Operand blocks_of(std::vector<float>& w, Shape shape) {
  Operand q(shape, Fp8Tiles::Blocks);
  fp8_quantize_blocks(q.t, Fp8Tensor{}, f32_tensor(w.data(), shape));
  q.dequantize();
  return q;
}

Operand columns_of(std::vector<float>& x, int64_t M, int64_t K, std::vector<int32_t>& offsets, int64_t Mp) {
  Operand q({K, Mp}, Fp8Tiles::Columns);
  fp8_quantize_columns(q.t, f32_tensor(x.data(), {M, K}),
                       i32_tensor(offsets.data(), {static_cast<int64_t>(offsets.size())}));
  q.dequantize();
  return q;
}

// sum_k a[k] b[k] in FP64 over n terms with strides, and the sum of |terms| (the error scale).
struct Dot {
  double value = 0, magnitude = 0;
};
Dot dot(const float* a, int64_t a_stride, const float* b, int64_t b_stride, int64_t n) {
  Dot d;
  for (int64_t i = 0; i < n; ++i) {
    const double term = static_cast<double>(a[i * a_stride]) * b[i * b_stride];
    d.value += term;
    d.magnitude += std::fabs(term);
  }
  return d;
}

void expect_near_dot(float got, double base, const Dot& d, const char* what) {
  const double want = base + d.value;
  ASSERT_LE(std::fabs(got - want), 1e-5 * (d.magnitude + std::fabs(base)) + 1e-30) << what << ": " << got << " vs "
                                                                                     << want;
}

std::vector<int32_t> offsets_of(const std::vector<int32_t>& counts) {
  std::vector<int32_t> o = {0};
  for (int32_t c : counts) o.push_back(o.back() + c);
  return o;
}

TEST(Fp8Matmul, dense_product_with_block_weights_matches_fp64_of_the_dequantized_operands) {
  const int64_t M = 37, K = 300, N = 150;  // partial tiles along K and N
  std::vector<float> x = random_vec(M * K, 1), w = random_vec(N * K, 2, 0.02);
  const Operand a = rows_of(x, M, K), b = blocks_of(w, {N, K});
  for (bool accumulate : {false, true}) {
    std::vector<float> c = accumulate ? random_vec(M * N, 3) : std::vector<float>(M * N, kNan);
    const std::vector<float> before = c;
    fp8_matmul(f32_tensor(c.data(), {M, N}), a.t, b.t, accumulate);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        expect_near_dot(c[m * N + n], accumulate ? before[m * N + n] : 0.0,
                        dot(&a.values[m * K], 1, &b.values[n * K], 1, K), accumulate ? "c += a b^T" : "c = a b^T");
  }
}

// The dense weight gradient: c [N, K] = dy^T x, both operands in the columns layout (one segment).
TEST(Fp8Matmul, dense_product_of_columns_operands_is_the_weight_gradient) {
  const int64_t M = 200, K = 130, N = 70;
  std::vector<float> x = random_vec(M * K, 4), dy = random_vec(M * N, 5, 1e-3);
  std::vector<int32_t> one = {0, static_cast<int32_t>(M)};
  const int64_t Mp = fp8_columns_capacity(M, 1);
  const Operand dy_t = columns_of(dy, M, N, one, Mp), x_t = columns_of(x, M, K, one, Mp);
  std::vector<float> dw(N * K, kNan);
  fp8_matmul(f32_tensor(dw.data(), {N, K}), dy_t.t, x_t.t, false);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      expect_near_dot(dw[n * K + k], 0.0, dot(&dy_t.values[n * Mp], 1, &x_t.values[k * Mp], 1, M), "dw = dy^T x");
}

TEST(Fp8Matmul, grouped_product_multiplies_each_experts_rows_and_leaves_spare_rows) {
  const int64_t K = 200, N = 136, spare = 5;
  const std::vector<int32_t> counts = {0, 130, 0, 5, 200, 0};
  std::vector<int32_t> offsets = offsets_of(counts);
  const int64_t E = static_cast<int64_t>(counts.size()), used = offsets.back(), M = used + spare;
  std::vector<float> x = random_vec(M * K, 6), w = random_vec(E * N * K, 7, 0.05);
  const Operand a = rows_of(x, M, K), b = blocks_of(w, {E, N, K});
  std::vector<float> c(M * N, kNan);
  for (int64_t i = used * N; i < M * N; ++i) c[i] = kSentinel;
  fp8_grouped_matmul(f32_tensor(c.data(), {M, N}), a.t, b.t, i32_tensor(offsets.data(), {E + 1}));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t m = offsets[e]; m < offsets[e + 1]; ++m)
      for (int64_t n = 0; n < N; ++n)
        expect_near_dot(c[m * N + n], 0.0, dot(&a.values[m * K], 1, &b.values[(e * N + n) * K], 1, K),
                        "c_e = a_e b_e^T");
  for (int64_t i = used * N; i < M * N; ++i) ASSERT_EQ(c[i], kSentinel) << "spare row " << i / N;
}

// db[e] = dy_e^T x_e over the expert's rows, read from the columns layout; empty experts get zeros
// (accumulate off) or keep their values (accumulate on).
TEST(Fp8Matmul, grouped_wgrad_contracts_each_experts_column_segment) {
  const int64_t K = 130, N = 72;
  const std::vector<int32_t> counts = {0, 129, 3, 0, 128, 0};
  std::vector<int32_t> offsets = offsets_of(counts);
  const int64_t E = static_cast<int64_t>(counts.size()), M = offsets.back() + 4;
  const int64_t Mp = fp8_columns_capacity(M, E);
  std::vector<float> x = random_vec(M * K, 8), dy = random_vec(M * N, 9, 1e-2);
  const Operand dy_t = columns_of(dy, M, N, offsets, Mp), x_t = columns_of(x, M, K, offsets, Mp);
  for (bool accumulate : {false, true}) {
    std::vector<float> db = random_vec(E * N * K, 10);
    const std::vector<float> before = db;
    fp8_grouped_matmul_wgrad(f32_tensor(db.data(), {E, N, K}), dy_t.t, x_t.t, i32_tensor(offsets.data(), {E + 1}),
                             accumulate);
    int64_t p = 0;  // expert e's first column
    for (int64_t e = 0; e < E; ++e) {
      const int64_t rows = counts[e];
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const int64_t i = (e * N + n) * K + k;
          if (rows == 0) {
            ASSERT_EQ(db[i], accumulate ? before[i] : 0.0f) << "empty expert " << e;
            continue;
          }
          expect_near_dot(db[i], accumulate ? before[i] : 0.0,
                          dot(&dy_t.values[n * Mp + p], 1, &x_t.values[k * Mp + p], 1, rows), "db_e");
        }
      p += (rows + kFp8Tile - 1) / kFp8Tile * kFp8Tile;
    }
  }
}

// Expert e's segment starts at column p_e = the sum of the earlier experts' rows rounded up to 128,
// written out by hand here.
TEST(Fp8Matmul, grouped_wgrad_reads_each_expert_at_its_padded_column_start) {
  const int64_t K = 40, N = 24;
  const std::vector<int32_t> counts = {3, 0, 140};
  std::vector<int32_t> offsets = offsets_of(counts);
  const int64_t E = 3, M = offsets.back(), Mp = fp8_columns_capacity(M, E);
  std::vector<float> x = random_vec(M * K, 11), dy = random_vec(M * N, 12);
  const Operand dy_t = columns_of(dy, M, N, offsets, Mp), x_t = columns_of(x, M, K, offsets, Mp);
  std::vector<float> db(E * N * K, kNan);
  fp8_grouped_matmul_wgrad(f32_tensor(db.data(), {E, N, K}), dy_t.t, x_t.t, i32_tensor(offsets.data(), {E + 1}),
                           false);
  const int64_t starts[] = {0, 128, 128};  // expert 0 pads to 128, expert 1 is empty
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        expect_near_dot(db[(e * N + n) * K + k], 0.0,
                        dot(&dy_t.values[n * Mp + starts[e]], 1, &x_t.values[k * Mp + starts[e]], 1, counts[e]),
                        "db_e");
  // The column values there are expert 2's rows of x (within the E4M3 rounding).
  for (int64_t m = offsets[2]; m < offsets[3]; ++m)
    ASSERT_NEAR(x_t.values[5 * Mp + 128 + (m - offsets[2])], x[m * K + 5], std::fabs(x[m * K + 5]) / 16 + 1e-4);
}

// A non-finite input gives its tile a NaN scale, and the NaN reaches the product's row instead of
// being clipped to 448.
TEST(Fp8Matmul, a_nonfinite_input_makes_its_output_row_nan) {
  const int64_t M = 3, K = 256, N = 4;
  std::vector<float> x = random_vec(M * K, 13), w = random_vec(N * K, 14);
  x[1 * K + 200] = std::numeric_limits<float>::infinity();
  const Operand a = rows_of(x, M, K), b = blocks_of(w, {N, K});
  std::vector<float> c(M * N, 0.0f);
  fp8_matmul(f32_tensor(c.data(), {M, N}), a.t, b.t, false);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) EXPECT_EQ(std::isnan(c[m * N + n]), m == 1) << m << ", " << n;
}

}  // namespace
}  // namespace moe

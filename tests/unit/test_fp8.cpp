// FP8 quantize and dequantize on the CPU (moe/ops/fp8.h) against naive loops over the layouts:
// Rows tiles, the segmented transposed columns layout, Blocks and their transposed orientation.
// The reference scale is found by a search for the smallest fitting power of two, the codes by the
// scalar encoder (tested against the format's definition in test_fp8_scalar.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "moe/core/dtype.h"
#include "moe/core/fp8.h"
#include "moe/core/rng.h"
#include "moe/ops/fp8.h"

namespace moe {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kTile = kFp8Tile;

int64_t tiles(int64_t n) { return (n + kTile - 1) / kTile; }

// The smallest 2^k (k >= -126) with amax <= 448 * 2^k; 1 for a zero tile; NaN when the tile holds
// a NaN or an infinity.
float reference_scale(const std::vector<float>& tile) {
  double amax = 0;
  for (float v : tile) {
    if (!std::isfinite(v)) return kNan;
    amax = std::max(amax, std::fabs(static_cast<double>(v)));
  }
  if (amax == 0) return 1.0f;
  int k = -126;
  while (amax > 448.0 * std::ldexp(1.0, k)) ++k;
  return std::ldexp(1.0f, k);
}

uint8_t reference_code(float x, float scale) {
  if (std::isnan(scale)) return fp8::kE4m3NanCode;
  return fp8::e4m3_from_f32(static_cast<float>(x / static_cast<double>(scale)));  // exact: a power of two
}

// Values across 40 binades (a random binade per tile of 128 along the last dim, so tiles' scales
// differ), with exact zeros here and there.
std::vector<float> random_values(int64_t rows, int64_t cols, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < tiles(cols); ++j) {
      const int binade = static_cast<int>(rng.below(40)) - 20;
      for (int64_t c = j * kTile; c < std::min(cols, (j + 1) * kTile); ++c)
        v[r * cols + c] = rng.below(17) == 0 ? 0.0f : static_cast<float>(rng.normal() * std::ldexp(1.0, binade));
    }
  return v;
}

// Bit-equal scales (NaN equals NaN).
void expect_same_scales(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))))
      ADD_FAILURE() << "scale " << i << ": " << got[i] << " != " << want[i];
}

void expect_same_codes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && ++bad <= 5) ADD_FAILURE() << "code " << i << ": " << int(got[i]) << " != " << int(want[i]);
  EXPECT_EQ(bad, 0);
}

// An FP8 tensor owning its buffers, filled with garbage so that an unwritten element shows.
struct OwnedFp8 {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  Fp8Tensor t;
  OwnedFp8(Shape shape, Fp8Tiles tiles_kind) {
    const Shape scale_shape = fp8_scale_shape(shape, tiles_kind);
    codes.assign(static_cast<size_t>(shape.numel()), 0xa5);
    scales.assign(static_cast<size_t>(scale_shape.numel()), -3.0f);
    t = {Tensor(codes.data(), DType::FP8_E4M3, shape), f32_tensor(scales.data(), scale_shape), tiles_kind};
  }
};

// x [M, K] with a zero tile, a tile holding a NaN and one holding an infinity; K = 300 ends in a
// partial tile of 44.
std::vector<float> rows_input(int64_t M, int64_t K) {
  std::vector<float> x = random_values(M, K, 3);
  for (int64_t k = 128; k < 256; ++k) x[1 * K + k] = 0.0f;
  x[2 * K + 5] = kNan;
  x[3 * K + 290] = -kInf;
  return x;
}

void expect_rows_quantized(const std::vector<float>& x, int64_t M, int64_t K, const OwnedFp8& q) {
  std::vector<uint8_t> codes(x.size());
  std::vector<float> scales(static_cast<size_t>(M * tiles(K)));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < tiles(K); ++j) {
      const int64_t k0 = j * kTile, k1 = std::min(K, k0 + kTile);
      const float scale = reference_scale(std::vector<float>(x.begin() + m * K + k0, x.begin() + m * K + k1));
      scales[m * tiles(K) + j] = scale;
      for (int64_t k = k0; k < k1; ++k) codes[m * K + k] = reference_code(x[m * K + k], scale);
    }
  expect_same_codes(q.codes, codes);
  expect_same_scales(q.scales, scales);
}

TEST(Fp8Quantize, rows_match_naive_tiles_with_partial_zero_and_nonfinite_tiles) {
  const int64_t M = 5, K = 300;
  const std::vector<float> x = rows_input(M, K);
  OwnedFp8 q({M, K}, Fp8Tiles::Rows);
  fp8_quantize_rows(q.t, f32_tensor(const_cast<float*>(x.data()), {M, K}));
  expect_rows_quantized(x, M, K, q);
  EXPECT_EQ(q.scales[1 * tiles(K) + 1], 1.0f);                    // the zero tile
  EXPECT_TRUE(std::isnan(q.scales[2 * tiles(K) + 0]));            // NaN tile: NaN scale
  EXPECT_EQ(q.codes[2 * K + 100], fp8::kE4m3NanCode);             // ... and NaN codes
  EXPECT_TRUE(std::isnan(q.scales[3 * tiles(K) + 2]));            // infinity in the partial tile
}

TEST(Fp8Quantize, rows_of_bf16_input_quantize_its_values) {
  const int64_t M = 5, K = 300;
  std::vector<float> x = rows_input(M, K);
  std::vector<uint16_t> x_bf16(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x_bf16[i] = f32_to_bf16(x[i]);
    x[i] = bf16_to_f32(x_bf16[i]);  // the values the op sees
  }
  OwnedFp8 q({M, K}, Fp8Tiles::Rows);
  fp8_quantize_rows(q.t, Tensor(x_bf16.data(), DType::BF16, {M, K}));
  expect_rows_quantized(x, M, K, q);
}

// The columns layout by its definition: segment g's row o_g + i is column p_g + i; everything else
// is code 0; tiles past the last segment have scale 1.
void expect_columns_quantized(const std::vector<float>& x, int64_t K, const std::vector<int32_t>& offsets,
                              int64_t Mp, const OwnedFp8& q) {
  std::vector<uint8_t> codes(static_cast<size_t>(K * Mp), 0);
  std::vector<float> scales(static_cast<size_t>(tiles(Mp) * K), 1.0f);  // tile-major [tiles(Mp), K]
  int64_t p = 0;
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    for (int64_t t = 0; t < tiles(rows); ++t)
      for (int64_t k = 0; k < K; ++k) {
        std::vector<float> tile;
        for (int64_t i = t * kTile; i < std::min(rows, (t + 1) * kTile); ++i)
          tile.push_back(x[(offsets[g] + i) * K + k]);
        const float scale = reference_scale(tile);
        scales[(p / kTile + t) * K + k] = scale;
        for (size_t i = 0; i < tile.size(); ++i) codes[k * Mp + p + t * kTile + i] = reference_code(tile[i], scale);
      }
    p += tiles(rows) * kTile;
  }
  expect_same_codes(q.codes, codes);
  expect_same_scales(q.scales, scales);
}

TEST(Fp8Quantize, columns_place_each_segment_on_its_tile_with_zero_padding) {
  const int64_t K = 200;
  // Empty segments first, in the middle and last; a segment of exactly one tile, one of one row,
  // one spanning a partial second tile; spare rows past offsets[G].
  const std::vector<int32_t> counts = {0, 130, 0, 1, 128, 7, 0};
  std::vector<int32_t> offsets = {0};
  for (int32_t c : counts) offsets.push_back(offsets.back() + c);
  const int64_t M = offsets.back() + 9, G = static_cast<int64_t>(counts.size());
  std::vector<float> x = random_values(M, K, 17);
  x[129 * K + 7] = kNan;  // segment 1's second tile (rows 128, 129), at k = 7
  x[130 * K + 50] = kInf;  // segment 3's only row
  const int64_t Mp = fp8_columns_capacity(M, G) + kTile;  // one more tile than needed: scale 1
  OwnedFp8 q({K, Mp}, Fp8Tiles::Columns);
  fp8_quantize_columns(q.t, f32_tensor(x.data(), {M, K}), i32_tensor(offsets.data(), {G + 1}));
  expect_columns_quantized(x, K, offsets, Mp, q);
  // The padded positions by hand: segment 1 covers columns [0, 256), segment 3 starts at 256.
  EXPECT_EQ(q.codes[0 * Mp + 200], 0);  // segment 1's second tile past its 2 rows
  EXPECT_TRUE(std::isnan(q.scales[1 * K + 7]));  // tile 1, feature 7
  EXPECT_EQ(q.codes[7 * Mp + 129], fp8::kE4m3NanCode);  // that tile holds the NaN: NaN codes ...
  EXPECT_EQ(q.codes[7 * Mp + 200], 0);                   // ... but its padding stays 0
  EXPECT_TRUE(std::isnan(q.scales[2 * K + 50]));  // segment 3 = tile 2, its infinity
  EXPECT_EQ(q.scales[(tiles(Mp) - 1) * K + 0], 1.0f);  // the extra tile past the last segment
}

// What ep.payload = "fp8" relies on for the expert weight gradient: quantizing along the tokens
// the dequantized 1 x 128 row tiles of x (all that reaches the expert) gives the values that
// quantizing x itself gives, for every element that is an E4M3 normal number in its row tile and in
// both column tiles (scales are powers of two, so a normal value rounds to the same 4 significant
// bits under any scale, and one already rounded stays put). Only elements that fall into an E4M3
// subnormal range (below 2^-6 of a tile's scale, about 2^-14 of its largest value) may differ, and
// then by at most the quantization errors involved: 0.2 |x| + 2^-9 (s_row + s_col + s_col').
// Rows span 40 binades (a random binade per row tile), so column tiles mix binades and the
// subnormal case occurs (checked, so that the exception is exercised).
TEST(Fp8Quantize, columns_of_dequantized_row_tiles_equal_columns_of_the_rows_where_values_are_normal) {
  const int64_t M = 300, K = 260;
  std::vector<int32_t> offsets = {0, 100, 100, 300};
  const int64_t G = 3, Mp = fp8_columns_capacity(M, G);
  std::vector<float> x = random_values(M, K, 29);
  OwnedFp8 rows({M, K}, Fp8Tiles::Rows), direct({K, Mp}, Fp8Tiles::Columns), via_rows({K, Mp}, Fp8Tiles::Columns);
  fp8_quantize_rows(rows.t, f32_tensor(x.data(), {M, K}));
  std::vector<float> x_rows(x.size());
  fp8_dequantize(f32_tensor(x_rows.data(), {M, K}), rows.t);
  const Tensor offsets_t = i32_tensor(offsets.data(), {G + 1});
  fp8_quantize_columns(direct.t, f32_tensor(x.data(), {M, K}), offsets_t);
  fp8_quantize_columns(via_rows.t, f32_tensor(x_rows.data(), {M, K}), offsets_t);
  std::vector<float> a(static_cast<size_t>(K * Mp)), b(a.size());
  fp8_dequantize(f32_tensor(a.data(), {K, Mp}), direct.t);
  fp8_dequantize(f32_tensor(b.data(), {K, Mp}), via_rows.t);

  const float normal = std::ldexp(1.0f, -6);  // smallest normal E4M3 magnitude
  int64_t checked = 0, subnormal = 0, differing = 0;
  for (int64_t g = 0, column = 0; g < G; column += (offsets[g + 1] - offsets[g] + kTile - 1) / kTile * kTile, ++g)
    for (int64_t t = offsets[g]; t < offsets[g + 1]; ++t) {
      const int64_t p = column + (t - offsets[g]);  // token t's column in the columns layout
      for (int64_t j = 0; j < K; ++j) {
        const float v = x[t * K + j], s_row = rows.scales[t * tiles(K) + j / kTile];
        const float s_a = direct.scales[p / kTile * K + j], s_b = via_rows.scales[p / kTile * K + j];
        const float got = b[j * Mp + p], want = a[j * Mp + p];
        const bool normal_everywhere = std::fabs(v) >= normal * s_row && std::fabs(v) >= normal * s_a &&
                                       std::fabs(x_rows[t * K + j]) >= normal * s_b;
        ++checked;
        if (v == 0.0f || normal_everywhere) {
          ASSERT_EQ(got, want) << "token " << t << ", feature " << j << ": x = " << v;
          continue;
        }
        ++subnormal;
        differing += got != want;
        const double bound = 0.2 * std::fabs(v) + std::ldexp(1.0, -9) * (s_row + s_a + s_b);
        ASSERT_LE(std::fabs(static_cast<double>(got) - want), bound) << "token " << t << ", feature " << j;
      }
    }
  std::printf("  %lld elements, %lld subnormal in some tile, %lld of those differ\n", static_cast<long long>(checked),
              static_cast<long long>(subnormal), static_cast<long long>(differing));
  EXPECT_GT(differing, 0) << "the input should reach the subnormal case";
}

TEST(Fp8Quantize, columns_without_offsets_are_one_segment_of_all_rows) {
  const int64_t M = 300, K = 130;
  std::vector<float> x = random_values(M, K, 19);
  std::vector<uint16_t> x_bf16(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x_bf16[i] = f32_to_bf16(x[i]);
    x[i] = bf16_to_f32(x_bf16[i]);
  }
  const int64_t Mp = fp8_columns_capacity(M, 1);
  EXPECT_EQ(Mp, 384);
  OwnedFp8 q({K, Mp}, Fp8Tiles::Columns);
  fp8_quantize_columns(q.t, Tensor(x_bf16.data(), DType::BF16, {M, K}), Tensor());
  expect_columns_quantized(x, K, {0, static_cast<int32_t>(M)}, Mp, q);
}

TEST(Fp8Quantize, columns_of_segments_without_rows_are_all_padding) {
  const int64_t M = 4, K = 3;
  std::vector<float> x = random_values(M, K, 23);
  std::vector<int32_t> offsets = {0, 0, 0};
  const int64_t Mp = fp8_columns_capacity(M, 2);
  OwnedFp8 q({K, Mp}, Fp8Tiles::Columns);
  fp8_quantize_columns(q.t, f32_tensor(x.data(), {M, K}), i32_tensor(offsets.data(), {3}));
  expect_same_codes(q.codes, std::vector<uint8_t>(q.codes.size(), 0));
  expect_same_scales(q.scales, std::vector<float>(q.scales.size(), 1.0f));
}

void expect_blocks_quantized(const std::vector<float>& w, int64_t E, int64_t N, int64_t K, const OwnedFp8& q) {
  std::vector<uint8_t> codes(w.size());
  std::vector<float> scales(static_cast<size_t>(E * tiles(N) * tiles(K)));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < tiles(N); ++i)
      for (int64_t j = 0; j < tiles(K); ++j) {
        std::vector<float> block;
        for (int64_t n = i * kTile; n < std::min(N, (i + 1) * kTile); ++n)
          for (int64_t k = j * kTile; k < std::min(K, (j + 1) * kTile); ++k) block.push_back(w[(e * N + n) * K + k]);
        const float scale = reference_scale(block);
        scales[(e * tiles(N) + i) * tiles(K) + j] = scale;
        for (int64_t n = i * kTile; n < std::min(N, (i + 1) * kTile); ++n)
          for (int64_t k = j * kTile; k < std::min(K, (j + 1) * kTile); ++k)
            codes[(e * N + n) * K + k] = reference_code(w[(e * N + n) * K + k], scale);
      }
  expect_same_codes(q.codes, codes);
  expect_same_scales(q.scales, scales);
}

// w [E, 200, 300]: partial blocks along both dims, a zero block (first expert), a NaN block (last).
std::vector<float> blocks_input(int64_t E, int64_t N, int64_t K) {
  // random_values varies the binade per 128 columns and row; blocks then mix binades, as real ones.
  std::vector<float> w = random_values(E * N, K, 29);
  for (int64_t n = 128; n < 200; ++n)
    for (int64_t k = 0; k < 128; ++k) w[(0 * N + n) * K + k] = 0.0f;
  w[((E - 1) * N + 150) * K + 260] = kNan;
  return w;
}

TEST(Fp8Quantize, blocks_match_naive_128x128_blocks) {
  const int64_t E = 2, N = 200, K = 300;
  const std::vector<float> w = blocks_input(E, N, K);
  OwnedFp8 q({E, N, K}, Fp8Tiles::Blocks);
  fp8_quantize_blocks(q.t, Fp8Tensor{}, f32_tensor(const_cast<float*>(w.data()), {E, N, K}));
  expect_blocks_quantized(w, E, N, K, q);
  EXPECT_EQ(q.scales[(0 * 2 + 1) * 3 + 0], 1.0f);
  EXPECT_TRUE(std::isnan(q.scales[(1 * 2 + 1) * 3 + 2]));
}

TEST(Fp8Quantize, blocks_transposed_orientation_equals_quantizing_the_transpose) {
  for (const Shape& shape : {Shape{200, 300}, Shape{2, 200, 300}}) {
    const int64_t E = shape.ndim == 3 ? shape[0] : 1, N = shape[shape.ndim - 2], K = shape[shape.ndim - 1];
    const std::vector<float> w = blocks_input(E, N, K);
    std::vector<float> w_t(w.size());
    for (int64_t e = 0; e < E; ++e)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) w_t[(e * K + k) * N + n] = w[(e * N + n) * K + k];
    const Shape shape_t = shape.ndim == 3 ? Shape{E, K, N} : Shape{K, N};
    OwnedFp8 q(shape, Fp8Tiles::Blocks), q_t(shape_t, Fp8Tiles::Blocks), want_t(shape_t, Fp8Tiles::Blocks);
    fp8_quantize_blocks(q.t, q_t.t, f32_tensor(const_cast<float*>(w.data()), shape));
    fp8_quantize_blocks(want_t.t, Fp8Tensor{}, f32_tensor(w_t.data(), shape_t));
    expect_blocks_quantized(w, E, N, K, q);
    expect_same_codes(q_t.codes, want_t.codes);
    expect_same_scales(q_t.scales, want_t.scales);
  }
}

TEST(Fp8Dequantize, values_are_code_times_tile_scale_in_f32_and_bf16) {
  const int64_t E = 2, N = 200, K = 300;
  const std::vector<float> w = blocks_input(E, N, K);
  OwnedFp8 blocks({E, N, K}, Fp8Tiles::Blocks), rows({E * N, K}, Fp8Tiles::Rows);
  fp8_quantize_blocks(blocks.t, Fp8Tensor{}, f32_tensor(const_cast<float*>(w.data()), {E, N, K}));
  fp8_quantize_rows(rows.t, f32_tensor(const_cast<float*>(w.data()), {E * N, K}));
  for (const OwnedFp8* q : {&blocks, &rows}) {
    const bool is_blocks = q == &blocks;
    std::vector<float> out(w.size());
    std::vector<uint16_t> out_bf16(w.size());
    fp8_dequantize(f32_tensor(out.data(), q->t.codes.shape), q->t);
    fp8_dequantize(Tensor(out_bf16.data(), DType::BF16, q->t.codes.shape), q->t);
    for (int64_t r = 0; r < E * N; ++r)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = r / N, n = r % N;
        const float scale = is_blocks ? q->scales[(e * tiles(N) + n / kTile) * tiles(K) + k / kTile]
                                      : q->scales[r * tiles(K) + k / kTile];
        const float want = fp8::e4m3_to_f32(q->codes[r * K + k]) * scale;
        const float got = out[r * K + k], got_bf16 = bf16_to_f32(out_bf16[r * K + k]);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got) && std::isnan(got_bf16)) << r << ", " << k;
        } else {
          ASSERT_EQ(got, want) << r << ", " << k;
          ASSERT_EQ(got_bf16, want) << r << ", " << k << " (the value is exact in BF16)";
        }
      }
  }
}

// Columns tiles: codes [K, Mp], the scale of row k's tile j at scales[j K + k] (tile-major).
TEST(Fp8Dequantize, columns_values_are_code_times_their_tile_major_scale) {
  const int64_t M = 300, K = 200;
  // A random binade per feature, so that neighbouring features' tiles have different scales.
  Rng rng(37);
  std::vector<int> binade(static_cast<size_t>(K));
  for (int& b : binade) b = static_cast<int>(rng.below(40)) - 20;
  std::vector<float> x(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) x[m * K + k] = static_cast<float>(rng.normal() * std::ldexp(1.0, binade[k]));
  std::vector<int32_t> offsets = {0, 130, 300};
  const int64_t Mp = fp8_columns_capacity(M, 2);
  OwnedFp8 q({K, Mp}, Fp8Tiles::Columns);
  fp8_quantize_columns(q.t, f32_tensor(const_cast<float*>(x.data()), {M, K}), i32_tensor(offsets.data(), {3}));
  std::vector<float> out(static_cast<size_t>(K * Mp));
  std::vector<uint16_t> out_bf16(out.size());
  fp8_dequantize(f32_tensor(out.data(), {K, Mp}), q.t);
  fp8_dequantize(Tensor(out_bf16.data(), DType::BF16, {K, Mp}), q.t);
  int64_t distinct_scales = 0;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t c = 0; c < Mp; ++c) {
      const float scale = q.scales[c / kTile * K + k];
      distinct_scales += c % kTile == 0 && k > 0 && scale != q.scales[c / kTile * K + k - 1];
      const float want = fp8::e4m3_to_f32(q.codes[k * Mp + c]) * scale;
      ASSERT_EQ(out[k * Mp + c], want) << k << ", " << c;
      ASSERT_EQ(bf16_to_f32(out_bf16[k * Mp + c]), want) << k << ", " << c << " (the value is exact in BF16)";
    }
  EXPECT_GT(distinct_scales, K) << "neighbouring features should have different scales, or the layout goes unchecked";
}

// E4M3 keeps 3 mantissa bits: rounding to nearest moves a value x/s in the normal range
// ([2^-6, 448]) by at most half an ulp, 2^-4 of its binade's bottom, so |x - q| <= 2^-4 |x|; below
// 2^-6 the grid is the subnormal spacing 2^-9, so |x - q| <= 2^-10 s (s the tile's scale). The
// scale keeps x/s <= 448, so nothing saturates.
TEST(Fp8Dequantize, round_trip_error_is_within_half_an_e4m3_ulp) {
  const int64_t M = 64, K = 512;
  const std::vector<float> x = random_values(M, K, 31);
  OwnedFp8 q({M, K}, Fp8Tiles::Rows);
  fp8_quantize_rows(q.t, f32_tensor(const_cast<float*>(x.data()), {M, K}));
  std::vector<float> back(x.size());
  fp8_dequantize(f32_tensor(back.data(), {M, K}), q.t);
  int64_t normal = 0, subnormal = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const double v = x[m * K + k], error = std::fabs(v - back[m * K + k]);
      const double scale = q.scales[m * tiles(K) + k / kTile];
      if (std::fabs(v) / scale >= std::ldexp(1.0, -6)) {
        ++normal;
        ASSERT_LE(error, std::ldexp(std::fabs(v), -4)) << "x = " << v << " scale " << scale;
      } else {
        ++subnormal;
        ASSERT_LE(error, std::ldexp(scale, -10)) << "x = " << v << " scale " << scale;
      }
    }
  EXPECT_GT(normal, M * K / 2);
  EXPECT_GT(subnormal, 100);  // exact zeros and the small values of each tile
}

}  // namespace
}  // namespace moe

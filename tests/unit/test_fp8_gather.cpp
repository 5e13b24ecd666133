// The gathered FP8 operands (moe/ops/fp8_gather.h) against the path they replace: the expert input
// rows stored by scatter_rows_to_routes, or the expert output gradient rows stored by
// combine_rows_backward, then quantized by fp8_quantize_columns / fp8_quantize_rows_and_columns.
// Every code and scale must be equal (the rows layout over the rows inside the experts' segments);
// BF16 token rows against the same composition written out in loops (the CPU's permute ops move F32).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "moe/core/dtype.h"
#include "moe/core/error.h"
#include "moe/core/rng.h"
#include "moe/ops/fp8.h"
#include "moe/ops/fp8_gather.h"
#include "moe/ops/permute.h"
#include "moe/ops/route.h"
#include "routing_test_util.h"

namespace moe {
namespace {

// An expert-major placement of T tokens' top-K routes over N experts, clamped at `capacity` rows
// (drops), as the route ops make it; route_of_row its inverse.
struct Placement {
  int64_t T, N, K, rows;
  std::vector<int32_t> topk, counts, route_index, offsets, route_of_row;
  Placement(int64_t T_, int64_t N_, int64_t K_, int64_t capacity, uint64_t seed)
      : T(T_), N(N_), K(K_), rows(capacity), topk(testing::random_topk(T_, N_, K_, seed)), route_of_row(capacity) {
    testing::CpuPlacement p = testing::place_on_cpu(topk, T, N, K, capacity);
    counts = std::move(p.counts);
    route_index = std::move(p.route_index);
    offsets = std::move(p.offsets);
    invert_route_index(Tensor(route_of_row.data(), DType::I32, {rows}), index());
  }
  Tensor index() { return Tensor(route_index.data(), DType::I32, {T * K}); }
  Tensor offsets_tensor() { return Tensor(offsets.data(), DType::I32, {N + 1}); }
};

// An FP8 operand's codes and scales in owned storage.
struct Operand {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  Fp8Tensor t;
  explicit Operand(Shape shape, Fp8Tiles tiles = Fp8Tiles::Rows) {
    const Shape s = fp8_scale_shape(shape, tiles);
    codes.assign(static_cast<size_t>(shape.numel()), 0xAB);
    scales.assign(static_cast<size_t>(s.numel()), -1.0f);
    t = Fp8Tensor{Tensor(codes.data(), DType::FP8_E4M3, shape), Tensor(scales.data(), DType::F32, s), tiles};
  }
};

// The rows layout's codes and scales of rows [0, kept) (rows past the segments may be unwritten).
void expect_rows_equal(const Operand& want, const Operand& got, int64_t kept, int64_t D) {
  const int64_t tiles = (D + kFp8Tile - 1) / kFp8Tile;
  EXPECT_EQ(0, std::memcmp(want.codes.data(), got.codes.data(), static_cast<size_t>(kept * D))) << "row codes";
  EXPECT_EQ(0, std::memcmp(want.scales.data(), got.scales.data(), static_cast<size_t>(kept * tiles) * 4))
      << "row scales";
}

void expect_equal(const Operand& want, const Operand& got, const char* what) {
  EXPECT_EQ(want.codes, got.codes) << what << " codes";
  EXPECT_EQ(0, std::memcmp(want.scales.data(), got.scales.data(), want.scales.size() * 4)) << what << " scales";
}

std::vector<float> normal(size_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = scale * static_cast<float>(rng.normal());
  return v;
}

struct Case {
  int64_t T, N, K, D;
  double capacity_factor;  // rows = capacity_factor * T * K (< 1: drops, and rows no route fills)
};
// D 32: one partial tile; 160: a whole and a partial tile, runs of 16 not aligned to the tile; 264:
// a width that is not a multiple of 16.
const Case kCases[] = {{24, 4, 2, 32, 1.0}, {130, 8, 2, 160, 0.75}, {300, 16, 4, 264, 1.25}, {7, 8, 3, 128, 1.0}};

TEST(Fp8Gather, ColumnsOfGatheredTokenRowsAreThoseOfTheScatteredRows) {
  uint64_t seed = 10;
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "T " << c.T << " N " << c.N << " K " << c.K << " D " << c.D);
    Placement p(c.T, c.N, c.K, static_cast<int64_t>(c.capacity_factor * c.T * c.K), ++seed);
    std::vector<float> x = normal(static_cast<size_t>(c.T * c.D), ++seed, 3.0f);
    std::vector<float> stored(static_cast<size_t>(p.rows * c.D), 0.0f);
    const Tensor xt(x.data(), DType::F32, {c.T, c.D}), st(stored.data(), DType::F32, {p.rows, c.D});
    scatter_rows_to_routes(st, xt, p.index(), static_cast<int>(c.K));
    const Shape columns{c.D, fp8_columns_capacity(p.rows, c.N)};
    Operand want(columns, Fp8Tiles::Columns), got(columns, Fp8Tiles::Columns);
    fp8_quantize_columns(want.t, st, p.offsets_tensor());
    fp8_quantize_gathered_columns(
        got.t, GatheredRows{xt, Tensor(p.route_of_row.data(), DType::I32, {p.rows}), {}, static_cast<int>(c.K)},
        p.offsets_tensor());
    expect_equal(want, got, "columns");
  }
}

TEST(Fp8Gather, BothLayoutsOfWeightedTokenRowsAreThoseOfTheCombineGradient) {
  uint64_t seed = 20;
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "T " << c.T << " N " << c.N << " K " << c.K << " D " << c.D);
    Placement p(c.T, c.N, c.K, static_cast<int64_t>(c.capacity_factor * c.T * c.K), ++seed);
    std::vector<float> dout = normal(static_cast<size_t>(c.T * c.D), ++seed, 1e-3f);
    std::vector<float> w = normal(static_cast<size_t>(c.T * c.K), ++seed, 0.5f);
    std::vector<float> y(static_cast<size_t>(p.rows * c.D), 1.0f), dy(y.size(), 0.0f), dw(w.size());
    const Tensor dout_t(dout.data(), DType::F32, {c.T, c.D}), w_t(w.data(), DType::F32, {c.T, c.K});
    const Tensor dy_t(dy.data(), DType::F32, {p.rows, c.D});
    combine_rows_backward(dy_t, Tensor(dw.data(), DType::F32, {c.T, c.K}), dout_t,
                          Tensor(y.data(), DType::F32, {p.rows, c.D}), w_t, p.index(), static_cast<int>(c.K));
    const Shape columns{c.D, fp8_columns_capacity(p.rows, c.N)}, rows{p.rows, c.D};
    Operand want_c(columns, Fp8Tiles::Columns), got_c(columns, Fp8Tiles::Columns), want_r(rows), got_r(rows);
    fp8_quantize_rows_and_columns(want_r.t, want_c.t, dy_t, p.offsets_tensor());
    fp8_quantize_gathered_rows_and_columns(
        got_r.t, got_c.t,
        GatheredRows{dout_t, Tensor(p.route_of_row.data(), DType::I32, {p.rows}), w_t, static_cast<int>(c.K)},
        p.offsets_tensor());
    expect_equal(want_c, got_c, "columns");
    expect_rows_equal(want_r, got_r, p.offsets.back(), c.D);
  }
}

// BF16 token rows: each gathered value is the BF16 rounding of the FP32 product, as the GPU's
// combine backward stores it.
TEST(Fp8Gather, Bf16TokenRowsRoundTheWeightedProductToBf16) {
  const Case c{130, 8, 2, 160, 0.75};
  Placement p(c.T, c.N, c.K, static_cast<int64_t>(c.capacity_factor * c.T * c.K), 31);
  const std::vector<float> values = normal(static_cast<size_t>(c.T * c.D), 32, 2.0f);
  const std::vector<float> w = normal(static_cast<size_t>(c.T * c.K), 33, 0.5f);
  std::vector<uint16_t> x(values.size()), stored(static_cast<size_t>(p.rows * c.D), 0);
  for (size_t i = 0; i < x.size(); ++i) x[i] = f32_to_bf16(values[i]);
  for (int64_t r = 0; r < p.rows; ++r) {
    const int32_t i = p.route_of_row[static_cast<size_t>(r)];
    if (i < 0) continue;
    for (int64_t j = 0; j < c.D; ++j)
      stored[static_cast<size_t>(r * c.D + j)] =
          f32_to_bf16(w[i] * bf16_to_f32(x[static_cast<size_t>(i / c.K * c.D + j)]));
  }
  const Shape columns{c.D, fp8_columns_capacity(p.rows, c.N)}, rows{p.rows, c.D};
  Operand want_c(columns, Fp8Tiles::Columns), got_c(columns, Fp8Tiles::Columns), want_r(rows), got_r(rows);
  fp8_quantize_rows_and_columns(want_r.t, want_c.t, Tensor(stored.data(), DType::BF16, rows), p.offsets_tensor());
  std::vector<float> wv = w;
  fp8_quantize_gathered_rows_and_columns(got_r.t, got_c.t,
                                         GatheredRows{Tensor(x.data(), DType::BF16, {c.T, c.D}),
                                                      Tensor(p.route_of_row.data(), DType::I32, {p.rows}),
                                                      Tensor(wv.data(), DType::F32, {c.T, c.K}), static_cast<int>(c.K)},
                                         p.offsets_tensor());
  expect_equal(want_c, got_c, "columns");
  expect_rows_equal(want_r, got_r, p.offsets.back(), c.D);
}

// One error per bad argument, naming it.
TEST(Fp8Gather, BadArgumentsAreRefusedNamingThem) {
  std::vector<float> x(8 * 32), w(8 * 2);
  std::vector<int32_t> routes(16, -1), offsets = {0, 8, 16};
  Operand columns({32, fp8_columns_capacity(16, 2)}, Fp8Tiles::Columns), rows({16, 32});
  auto expect_error = [&](const GatheredRows& src, const char* name) {
    try {
      fp8_quantize_gathered_rows_and_columns(rows.t, columns.t, src, Tensor(offsets.data(), DType::I32, {3}));
      ADD_FAILURE() << "accepted a bad " << name;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  const Tensor xt(x.data(), DType::F32, {8, 32}), rt(routes.data(), DType::I32, {16});
  expect_error({xt, rt, Tensor(w.data(), DType::F32, {8, 1}), 2}, "weights");
  routes[3] = 16;  // route 16 of 8 tokens x top-2
  expect_error({xt, rt, {}, 2}, "route_of_row");
  routes[3] = -1;
  expect_error({xt, Tensor(routes.data(), DType::F32, {16}), {}, 2}, "route_of_row");
  expect_error({xt, rt, {}, 0}, "top_k");
  EXPECT_NO_THROW(fp8_quantize_gathered_rows_and_columns(rows.t, columns.t, {xt, rt, {}, 2},
                                                         Tensor(offsets.data(), DType::I32, {3})));
}

}  // namespace
}  // namespace moe

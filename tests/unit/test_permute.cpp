// Row movement and weighted combine against naive loops. Pure data movement (and the FP8 scatter,
// against fp8_quantize_rows) must be bit-exact;
// sums are compared with double references within stated tolerances.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "moe/core/error.h"
#include "moe/core/rng.h"
#include "moe/ops/fp8.h"
#include "moe/ops/permute.h"
#include "moe/ops/route.h"
#include "routing_test_util.h"

namespace moe {
namespace {

constexpr float kSentinel = -12345.0f;

std::vector<float> random_vec(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

bool bit_equal(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// A routing with drops, built by the route ops: random distinct experts per token, then the
// expert-major placement clamped at `capacity` rows.
struct Routing {
  int T, N, K, D;
  int64_t rows;  // buffer rows (capacity)
  std::vector<int32_t> topk, route_index, offsets, counts;

  Routing(int T_, int N_, int K_, int D_, int64_t capacity, uint64_t seed)
      : T(T_), N(N_), K(K_), D(D_), rows(capacity), topk(testing::random_topk(T_, N_, K_, seed)) {
    testing::CpuPlacement p = testing::place_on_cpu(topk, T, N, K, capacity);
    route_index = std::move(p.route_index);
    offsets = std::move(p.offsets);
    counts = std::move(p.counts);
  }
  Tensor index() { return i32_tensor(route_index.data(), {T * K}); }
  int64_t dropped() const {
    int64_t n = 0;
    for (int32_t r : route_index) n += r < 0;
    return n;
  }
};

struct Shape4 {
  int T, N, K, D;
  double capacity_factor;  // rows = capacity_factor * T * K
};
// The last shape is large enough to take the OpenMP path.
const Shape4 kShapes[] = {{1, 4, 1, 3, 1.0},      {13, 8, 2, 17, 1.0}, {13, 8, 2, 17, 0.6},
                          {40, 16, 4, 300, 0.75}, {9, 5, 5, 8, 0.5},   {256, 32, 4, 64, 0.8}};

// dst rows of kept routes equal their token's src row bit for bit; rows nobody routes to are untouched.
TEST(Permute, scatter_rows_to_routes_is_exact_and_skips_drops) {
  uint64_t seed = 1;
  for (const auto& s : kShapes) {
    const int64_t cap = static_cast<int64_t>(s.capacity_factor * s.T * s.K);
    Routing r(s.T, s.N, s.K, s.D, cap + 2, ++seed);  // +2 rows that no route may touch
    SCOPED_TRACE(::testing::Message() << "T=" << s.T << " K=" << s.K << " D=" << s.D << " dropped=" << r.dropped());
    auto src = random_vec(size_t(s.T) * s.D, ++seed);
    std::vector<float> dst(size_t(r.rows) * s.D, kSentinel);
    scatter_rows_to_routes(f32_tensor(dst.data(), {r.rows, s.D}), f32_tensor(src.data(), {s.T, s.D}), r.index(),
                           s.K);
    std::vector<float> expect(dst.size(), kSentinel);
    for (int t = 0; t < s.T; ++t)
      for (int k = 0; k < s.K; ++k) {
        const int32_t row = r.route_index[t * s.K + k];
        if (row >= 0) std::memcpy(&expect[size_t(row) * s.D], &src[size_t(t) * s.D], s.D * sizeof(float));
      }
    ASSERT_EQ(std::memcmp(dst.data(), expect.data(), dst.size() * sizeof(float)), 0);
  }
}

// Pure movement is dtype-agnostic: BF16 rows (stored as uint16) are copied bit for bit too.
TEST(Permute, scatter_rows_to_routes_moves_bf16_bits) {
  Routing r(7, 4, 2, 5, 14, 3);
  std::vector<uint16_t> src(7 * 5), dst(14 * 5, 0xffff);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 977 + 1);
  scatter_rows_to_routes(Tensor(dst.data(), DType::BF16, {14, 5}), Tensor(src.data(), DType::BF16, {7, 5}),
                         r.index(), 2);
  for (int t = 0; t < 7; ++t)
    for (int k = 0; k < 2; ++k)
      for (int d = 0; d < 5; ++d) ASSERT_EQ(dst[r.route_index[t * 2 + k] * 5 + d], src[t * 5 + d]);
}

// The FP8 dispatch scatter: every kept route's codes and scales rows are the token's row of
// fp8_quantize_rows(src), bit for bit (D = 300 and 17 end in a partial tile); rows no route names
// keep their sentinel bytes. Inputs span many binades so that tiles get different scales.
TEST(Permute, scatter_rows_to_routes_fp8_stores_the_quantized_token_rows) {
  uint64_t seed = 100;
  for (const auto& s : kShapes) {
    const int64_t cap = static_cast<int64_t>(s.capacity_factor * s.T * s.K);
    Routing r(s.T, s.N, s.K, s.D, cap + 2, ++seed);
    SCOPED_TRACE(::testing::Message() << "T=" << s.T << " K=" << s.K << " D=" << s.D << " dropped=" << r.dropped());
    auto src = random_vec(size_t(s.T) * s.D, ++seed);
    for (size_t i = 0; i < src.size(); ++i) src[i] = std::ldexp(src[i], static_cast<int>(i % 23) - 11);
    const int64_t tiles = (s.D + kFp8Tile - 1) / kFp8Tile;
    std::vector<uint8_t> quantized(size_t(s.T) * s.D);
    std::vector<float> quantized_scales(size_t(s.T) * tiles);
    fp8_quantize_rows(Fp8Tensor{Tensor(quantized.data(), DType::FP8_E4M3, {s.T, s.D}),
                                f32_tensor(quantized_scales.data(), {s.T, tiles}), Fp8Tiles::Rows},
                      f32_tensor(src.data(), {s.T, s.D}));

    std::vector<uint8_t> codes(size_t(r.rows) * s.D, 0xA5);
    std::vector<float> scales(size_t(r.rows) * tiles, kSentinel);
    scatter_rows_to_routes_fp8(Fp8Tensor{Tensor(codes.data(), DType::FP8_E4M3, {r.rows, s.D}),
                                         f32_tensor(scales.data(), {r.rows, tiles}), Fp8Tiles::Rows},
                               f32_tensor(src.data(), {s.T, s.D}), r.index(), s.K);
    std::vector<uint8_t> expect_codes(codes.size(), 0xA5);
    std::vector<float> expect_scales(scales.size(), kSentinel);
    for (int t = 0; t < s.T; ++t)
      for (int k = 0; k < s.K; ++k) {
        const int32_t row = r.route_index[t * s.K + k];
        if (row < 0) continue;
        std::memcpy(&expect_codes[size_t(row) * s.D], &quantized[size_t(t) * s.D], s.D);
        std::memcpy(&expect_scales[size_t(row) * tiles], &quantized_scales[size_t(t) * tiles], tiles * sizeof(float));
      }
    ASSERT_EQ(std::memcmp(codes.data(), expect_codes.data(), codes.size()), 0);
    ASSERT_EQ(std::memcmp(scales.data(), expect_scales.data(), scales.size() * sizeof(float)), 0);
  }
}

TEST(Permute, scatter_rows_to_routes_fp8_rejects_scales_of_another_shape) {
  Routing r(4, 4, 2, 130, 8, 5);  // 130 columns: 2 tiles per row
  std::vector<float> src(4 * 130);
  std::vector<uint8_t> codes(8 * 130);
  std::vector<float> scales(8 * 2);
  const Tensor codes_t(codes.data(), DType::FP8_E4M3, {8, 130});
  EXPECT_NO_THROW(scatter_rows_to_routes_fp8(Fp8Tensor{codes_t, f32_tensor(scales.data(), {8, 2}), Fp8Tiles::Rows},
                                             f32_tensor(src.data(), {4, 130}), r.index(), 2));
  try {
    scatter_rows_to_routes_fp8(Fp8Tensor{codes_t, f32_tensor(scales.data(), {8, 1}), Fp8Tiles::Rows},
                               f32_tensor(src.data(), {4, 130}), r.index(), 2);
    ADD_FAILURE() << "one scale per row of 130 columns was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dst.scales"), std::string::npos) << e.what();
  }
}

// dsrc[t] = (dsrc[t] +) sum over kept k of ddst[row]: within 1e-6 relative (+1e-6 absolute) of
// double; with K = 1 and no accumulate it is an exact move.
TEST(Permute, scatter_rows_to_routes_backward_matches_naive) {
  uint64_t seed = 100;
  for (const auto& s : kShapes)
    for (bool accumulate : {false, true}) {
      const int64_t cap = static_cast<int64_t>(s.capacity_factor * s.T * s.K);
      Routing r(s.T, s.N, s.K, s.D, cap, ++seed);
      SCOPED_TRACE(::testing::Message() << "T=" << s.T << " K=" << s.K << " D=" << s.D << " acc=" << accumulate);
      auto ddst = random_vec(size_t(r.rows) * s.D, ++seed);
      auto dsrc = random_vec(size_t(s.T) * s.D, ++seed);
      const auto before = dsrc;
      scatter_rows_to_routes_backward(f32_tensor(dsrc.data(), {s.T, s.D}), f32_tensor(ddst.data(), {r.rows, s.D}),
                                      r.index(), s.K, accumulate);
      for (int t = 0; t < s.T; ++t)
        for (int d = 0; d < s.D; ++d) {
          double want = accumulate ? before[t * s.D + d] : 0.0;
          for (int k = 0; k < s.K; ++k) {
            const int32_t row = r.route_index[t * s.K + k];
            if (row >= 0) want += ddst[size_t(row) * s.D + d];
          }
          ASSERT_NEAR(dsrc[t * s.D + d], want, 1e-6 * std::abs(want) + 1e-6) << "t=" << t << " d=" << d;
        }
    }
  Routing r(11, 6, 1, 9, 11, 7);
  auto ddst = random_vec(11 * 9, 8);
  std::vector<float> dsrc(11 * 9, kSentinel);
  scatter_rows_to_routes_backward(f32_tensor(dsrc.data(), {11, 9}), f32_tensor(ddst.data(), {11, 9}), r.index(), 1,
                                  false);
  for (int t = 0; t < 11; ++t)
    for (int d = 0; d < 9; ++d) ASSERT_TRUE(bit_equal(dsrc[t * 9 + d], ddst[r.route_index[t] * 9 + d]));
}

// out[t] = (out[t] +) sum_k w * y[row] over kept routes, within 1e-5 relative (+1e-6 absolute)
// of double; dropped routes contribute nothing (their weights are set huge to make a leak obvious).
TEST(Permute, combine_rows_matches_naive_with_drops) {
  uint64_t seed = 200;
  for (const auto& s : kShapes)
    for (bool accumulate : {false, true}) {
      const int64_t cap = static_cast<int64_t>(s.capacity_factor * s.T * s.K);
      Routing r(s.T, s.N, s.K, s.D, cap, ++seed);
      SCOPED_TRACE(::testing::Message() << "T=" << s.T << " K=" << s.K << " D=" << s.D << " acc=" << accumulate
                                      << " dropped=" << r.dropped());
      auto y = random_vec(size_t(r.rows) * s.D, ++seed);
      auto w = random_vec(size_t(s.T) * s.K, ++seed);
      for (size_t i = 0; i < w.size(); ++i)
        if (r.route_index[i] < 0) w[i] = 1e30f;
      auto out = random_vec(size_t(s.T) * s.D, ++seed);
      const auto before = out;
      combine_rows(f32_tensor(out.data(), {s.T, s.D}), f32_tensor(y.data(), {r.rows, s.D}),
                   f32_tensor(w.data(), {s.T, s.K}), r.index(), s.K, accumulate);
      for (int t = 0; t < s.T; ++t)
        for (int d = 0; d < s.D; ++d) {
          double want = accumulate ? before[t * s.D + d] : 0.0, mag = std::abs(want);
          for (int k = 0; k < s.K; ++k) {
            const int32_t row = r.route_index[t * s.K + k];
            if (row < 0) continue;
            const double term = double(w[t * s.K + k]) * y[size_t(row) * s.D + d];
            want += term;
            mag += std::abs(term);
          }
          ASSERT_NEAR(out[t * s.D + d], want, 1e-5 * mag + 1e-6) << "t=" << t << " d=" << d;
        }
    }
}

// scatter then combine with K = 1 and unit weights returns src bit for bit (a round trip through
// the expert-major buffer); a token whose only route is dropped comes back as zero.
TEST(Permute, scatter_combine_round_trip_is_exact) {
  const int T = 50, N = 8, D = 33;
  for (int64_t cap : {int64_t(T), int64_t(30)}) {
    Routing r(T, N, 1, D, cap, 9);
    auto src = random_vec(size_t(T) * D, 10);
    std::vector<float> buf(size_t(cap) * D, kSentinel), out(size_t(T) * D, kSentinel), w(T, 1.0f);
    scatter_rows_to_routes(f32_tensor(buf.data(), {cap, D}), f32_tensor(src.data(), {T, D}), r.index(), 1);
    combine_rows(f32_tensor(out.data(), {T, D}), f32_tensor(buf.data(), {cap, D}), f32_tensor(w.data(), {T, 1}),
                 r.index(), 1, false);
    for (int t = 0; t < T; ++t)
      for (int d = 0; d < D; ++d)
        ASSERT_TRUE(bit_equal(out[t * D + d], r.route_index[t] >= 0 ? src[t * D + d] : 0.0f)) << "t=" << t;
  }
}

// dy[row] = w * dout[t] exactly (a single FP32 product); rows of dropped routes and unused rows
// keep their old bits; dweights = dot(dout[t], y[row]) within 1e-5 relative to sum |terms| (+1e-6),
// and exactly 0 for dropped routes.
TEST(Permute, combine_rows_backward_matches_naive) {
  uint64_t seed = 300;
  for (const auto& s : kShapes) {
    const int64_t cap = static_cast<int64_t>(s.capacity_factor * s.T * s.K);
    Routing r(s.T, s.N, s.K, s.D, cap + 1, ++seed);
    SCOPED_TRACE(::testing::Message() << "T=" << s.T << " K=" << s.K << " D=" << s.D << " dropped=" << r.dropped());
    auto y = random_vec(size_t(r.rows) * s.D, ++seed);
    auto w = random_vec(size_t(s.T) * s.K, ++seed);
    auto dout = random_vec(size_t(s.T) * s.D, ++seed);
    std::vector<float> dy(size_t(r.rows) * s.D, kSentinel), dw(size_t(s.T) * s.K, kSentinel);
    combine_rows_backward(f32_tensor(dy.data(), {r.rows, s.D}), f32_tensor(dw.data(), {s.T, s.K}),
                          f32_tensor(dout.data(), {s.T, s.D}), f32_tensor(y.data(), {r.rows, s.D}),
                          f32_tensor(w.data(), {s.T, s.K}), r.index(), s.K);
    std::vector<float> dy_want(dy.size(), kSentinel);
    for (int t = 0; t < s.T; ++t)
      for (int k = 0; k < s.K; ++k) {
        const int i = t * s.K + k;
        const int32_t row = r.route_index[i];
        if (row < 0) {
          ASSERT_TRUE(bit_equal(dw[i], 0.0f)) << "dropped route " << i;
          continue;
        }
        double dot = 0, mag = 0;
        for (int d = 0; d < s.D; ++d) {
          dy_want[size_t(row) * s.D + d] = w[i] * dout[t * s.D + d];
          const double term = double(dout[t * s.D + d]) * y[size_t(row) * s.D + d];
          dot += term;
          mag += std::abs(term);
        }
        ASSERT_NEAR(dw[i], dot, 1e-5 * mag + 1e-6) << "route " << i;
      }
    ASSERT_EQ(std::memcmp(dy.data(), dy_want.data(), dy.size() * sizeof(float)), 0);
  }
}

// The weights' gradient alone: combine_rows_backward's dweights, bit for bit.
TEST(Permute, combine_rows_weight_grad_is_the_dweights_of_combine_rows_backward) {
  uint64_t seed = 400;
  for (const auto& s : kShapes) {
    const int64_t cap = static_cast<int64_t>(s.capacity_factor * s.T * s.K);
    Routing r(s.T, s.N, s.K, s.D, cap + 1, ++seed);
    SCOPED_TRACE(::testing::Message() << "T=" << s.T << " K=" << s.K << " D=" << s.D << " dropped=" << r.dropped());
    auto y = random_vec(size_t(r.rows) * s.D, ++seed);
    auto w = random_vec(size_t(s.T) * s.K, ++seed);
    auto dout = random_vec(size_t(s.T) * s.D, ++seed);
    std::vector<float> dy(size_t(r.rows) * s.D), want(size_t(s.T) * s.K, kSentinel), got(want.size(), kSentinel);
    combine_rows_backward(f32_tensor(dy.data(), {r.rows, s.D}), f32_tensor(want.data(), {s.T, s.K}),
                          f32_tensor(dout.data(), {s.T, s.D}), f32_tensor(y.data(), {r.rows, s.D}),
                          f32_tensor(w.data(), {s.T, s.K}), r.index(), s.K);
    combine_rows_weight_grad(f32_tensor(got.data(), {s.T, s.K}), f32_tensor(dout.data(), {s.T, s.D}),
                             f32_tensor(y.data(), {r.rows, s.D}), r.index(), s.K);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  }
}

// route_of_row names, for every buffer row, the route placed there, and -1 for rows none fills.
TEST(Permute, invert_route_index_names_each_rows_route) {
  uint64_t seed = 500;
  for (const auto& s : kShapes) {
    const int64_t cap = static_cast<int64_t>(s.capacity_factor * s.T * s.K);
    Routing r(s.T, s.N, s.K, s.D, cap + 1, ++seed);
    std::vector<int32_t> route_of_row(size_t(r.rows), 7);
    invert_route_index(i32_tensor(route_of_row.data(), {r.rows}), r.index());
    std::vector<int32_t> want(size_t(r.rows), -1);
    for (int i = 0; i < s.T * s.K; ++i)
      if (r.route_index[i] >= 0) want[size_t(r.route_index[i])] = i;
    EXPECT_EQ(route_of_row, want) << "T=" << s.T << " K=" << s.K;
  }
  std::vector<int32_t> rows(4), twice = {0, 1, 1, -1}, past = {0, 4, -1, 2};
  EXPECT_THROW(invert_route_index(i32_tensor(rows.data(), {4}), i32_tensor(twice.data(), {4})), Error);
  EXPECT_THROW(invert_route_index(i32_tensor(rows.data(), {4}), i32_tensor(past.data(), {4})), Error);
}

TEST(Permute, rejects_bad_route_index) {
  std::vector<float> src(4 * 2), dst(4 * 2);
  std::vector<int32_t> ri = {0, 4, 1, 2};  // row 4 is past the 4-row buffer
  auto call = [&]() {
    scatter_rows_to_routes(f32_tensor(dst.data(), {4, 2}), f32_tensor(src.data(), {2, 2}), i32_tensor(ri.data(), {4}),
                           2);
  };
  EXPECT_THROW(call(), Error);
  ri = {0, 1, 1, 2};  // row 1 used twice
  EXPECT_THROW(call(), Error);
  ri = {0, 1, -1, 2};
  EXPECT_NO_THROW(call());
}

}  // namespace
}  // namespace moe

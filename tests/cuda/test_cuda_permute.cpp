// CUDA row movement and weighted combine against the CPU, for row dtype F32 and BF16, on random
// rows and route indices built by the CPU's route_index_local with and without drops: T in {1, 37,
// 4096}, K in {1, 2, 8} (N = 64) and K = N = 8, row widths 6, 13, 256 (every copy width of
// scatter_rows_to_routes: 2-, 4- and 16-byte words).
//
// BF16 inputs are rounded to BF16 first, so the CPU (FP32) sees exactly the GPU's inputs.
// Tolerances:
//   - scatter_rows_to_routes (pure movement) and combine_rows_backward's dy (one product, rounded
//     once): exactly equal, including the rows nobody writes (which must keep the poison);
//   - scatter_rows_to_routes_backward, combine_rows: normalized error <= 1e-6 for F32 (same
//     operations in the same order as the CPU, so in practice exact), <= 1e-2 for BF16 (one
//     rounding to BF16 on store);
//   - combine_rows_backward's dweights (F32): normalized error <= 1e-5 (the dot products sum in
//     another order).
// Every op runs twice; the two results must be bit-identical. scatter_rows_to_routes_fp8 (the FP8
// dispatch) writes the CPU's codes and scales bit for bit (D 6, 13, 256 and 300: byte and word stores,
// a partial tile).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/rng.h"
#include "moe/ops/permute.h"
#include "moe/ops/route.h"
#include "../unit/routing_test_util.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;
using testing::normalized_error;
using testing::round_bf16;

struct Case {
  DType dtype;
  int T, N, K, D;
  int64_t capacity;
};

::testing::Message describe(const Case& c) {
  return ::testing::Message() << dtype_name(c.dtype) << " T=" << c.T << " N=" << c.N << " K=" << c.K << " D=" << c.D
                              << " capacity=" << c.capacity;
}

// Random values, rounded to BF16 when the rows are BF16.
std::vector<float> random_rows(size_t n, DType dtype, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return dtype == DType::BF16 ? round_bf16(v) : v;
}

// DeviceBuffer's poison (all bits set) as download() returns it for this dtype.
float poison(DType dtype) {
  const uint32_t bits = dtype == DType::F32 ? 0xffffffffu : 0xffff0000u;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Combined sums: tolerance by dtype (see the top of the file).
double sum_tolerance(DType dtype) { return dtype == DType::F32 ? 1e-6 : 1e-2; }

// A route index over `rows` buffer rows from random distinct experts per token (CPU route ops).
std::vector<int32_t> make_route_index(const Case& c, uint64_t seed, int64_t* rows) {
  const testing::CpuPlacement p =
      testing::place_on_cpu(testing::random_topk(c.T, c.N, c.K, seed), c.T, c.N, c.K, c.capacity);
  *rows = p.offsets[c.N] + 2;  // two rows that no route uses: they must keep their poison
  return p.route_index;
}

void check_permute(const Case& c, uint64_t seed) {
  SCOPED_TRACE(describe(c));
  const int T = c.T, K = c.K, D = c.D;
  int64_t rows = 0;
  std::vector<int32_t> index = make_route_index(c, seed, &rows);
  const Tensor index_h = i32_tensor(index.data(), {T * K});
  DeviceBuffer index_d(DType::I32, {T * K});
  index_d.upload_i32(index);

  const size_t token_elems = static_cast<size_t>(T) * D, row_elems = static_cast<size_t>(rows) * D;
  std::vector<float> src = random_rows(token_elems, c.dtype, seed + 1);
  std::vector<float> buf = random_rows(row_elems, c.dtype, seed + 2);  // ddst and y
  std::vector<float> init = random_rows(token_elems, c.dtype, seed + 3);  // dsrc / out before +=
  std::vector<float> dout = random_rows(token_elems, c.dtype, seed + 4);
  std::vector<float> weights(static_cast<size_t>(T) * K);
  Rng wrng(seed + 5);
  for (auto& w : weights) w = static_cast<float>(wrng.uniform());
  DeviceBuffer src_d(c.dtype, {T, D}), buf_d(c.dtype, {rows, D}), init_d(c.dtype, {T, D}), dout_d(c.dtype, {T, D}),
      weights_d(DType::F32, {T, K});
  src_d.upload(src);
  buf_d.upload(buf);
  init_d.upload(init);
  dout_d.upload(dout);
  weights_d.upload(weights);

  // scatter_rows_to_routes: exact, and the rows no route uses keep the poison.
  {
    std::vector<float> ref(row_elems, poison(c.dtype));
    scatter_rows_to_routes(f32_tensor(ref.data(), {rows, D}), f32_tensor(src.data(), {T, D}), index_h, K);
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      DeviceBuffer dst_d(c.dtype, {rows, D});
      scatter_rows_to_routes(dst_d, src_d, index_d, K);
      const std::vector<float> got = dst_d.download();
      if (run == 0) {
        EXPECT_TRUE(bits_equal(got, ref)) << "scatter_rows_to_routes differs from the CPU";
      } else {
        EXPECT_TRUE(bits_equal(got, first)) << "scatter_rows_to_routes differs between two runs";
      }
      first = got;
    }
  }

  // scatter_rows_to_routes_backward and combine_rows, overwriting (into poison) and accumulating.
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "accumulate=" << accumulate);
    std::vector<float> gather_ref = init, combine_ref = init;
    scatter_rows_to_routes_backward(f32_tensor(gather_ref.data(), {T, D}), f32_tensor(buf.data(), {rows, D}), index_h,
                                    K, accumulate);
    combine_rows(f32_tensor(combine_ref.data(), {T, D}), f32_tensor(buf.data(), {rows, D}),
                 f32_tensor(weights.data(), {T, K}), index_h, K, accumulate);
    std::vector<float> first_gather, first_combine;
    for (int run = 0; run < 2; ++run) {
      DeviceBuffer dsrc_d(c.dtype, {T, D}), out_d(c.dtype, {T, D});
      if (accumulate) {
        dsrc_d.upload(init);
        out_d.upload(init);
      }
      scatter_rows_to_routes_backward(dsrc_d, buf_d, index_d, K, accumulate);
      combine_rows(out_d, buf_d, weights_d, index_d, K, accumulate);
      const std::vector<float> dsrc = dsrc_d.download(), out = out_d.download();
      if (run == 0) {
        EXPECT_LE(normalized_error(dsrc, gather_ref), sum_tolerance(c.dtype)) << "scatter_rows_to_routes_backward";
        EXPECT_LE(normalized_error(out, combine_ref), sum_tolerance(c.dtype)) << "combine_rows";
      } else {
        EXPECT_TRUE(bits_equal(dsrc, first_gather)) << "scatter_rows_to_routes_backward differs between two runs";
        EXPECT_TRUE(bits_equal(out, first_combine)) << "combine_rows differs between two runs";
      }
      first_gather = dsrc;
      first_combine = out;
    }
  }

  // combine_rows_backward: dy exact (rows of dropped routes and unused rows keep the poison),
  // dweights within tolerance (0 for dropped routes).
  {
    std::vector<float> dy_ref(row_elems, poison(c.dtype)), dweights_ref(static_cast<size_t>(T) * K);
    combine_rows_backward(f32_tensor(dy_ref.data(), {rows, D}), f32_tensor(dweights_ref.data(), {T, K}),
                          f32_tensor(dout.data(), {T, D}), f32_tensor(buf.data(), {rows, D}),
                          f32_tensor(weights.data(), {T, K}), index_h, K);
    if (c.dtype == DType::BF16) dy_ref = round_bf16(dy_ref);  // the poison rounds to itself
    std::vector<float> first_dy, first_dweights;
    for (int run = 0; run < 2; ++run) {
      DeviceBuffer dy_d(c.dtype, {rows, D}), dweights_d(DType::F32, {T, K});
      combine_rows_backward(dy_d, dweights_d, dout_d, buf_d, weights_d, index_d, K);
      const std::vector<float> dy = dy_d.download(), dweights = dweights_d.download();
      if (run == 0) {
        EXPECT_TRUE(bits_equal(dy, dy_ref)) << "combine_rows_backward dy differs from the CPU";
        EXPECT_LE(normalized_error(dweights, dweights_ref), 1e-5) << "combine_rows_backward dweights";
        for (int i = 0; i < T * K; ++i) {
          if (index[i] < 0) {
            EXPECT_EQ(dweights[i], 0.0f) << "dweights of dropped route " << i;
          }
        }
      } else {
        EXPECT_TRUE(bits_equal(dy, first_dy)) << "combine_rows_backward dy differs between two runs";
        EXPECT_TRUE(bits_equal(dweights, first_dweights)) << "combine_rows_backward dweights differ between two runs";
      }
      first_dy = dy;
      first_dweights = dweights;
    }
  }
}
#endif

TEST(CudaPermute, RowOpsMatchCpuForF32AndBf16WithAndWithoutDrops) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  uint64_t seed = 1000;
  for (DType dtype : {DType::F32, DType::BF16})
    for (int T : {1, 37, 4096})
      for (int NK : {1, 2, 8, -8}) {  // -8: K = N = 8
        const int N = NK < 0 ? 8 : 64, K = NK < 0 ? 8 : NK;
        for (int D : {6, 13, 256}) {
          const int64_t routes = static_cast<int64_t>(T) * K;
          for (int64_t capacity : {routes, routes * 3 / 4}) check_permute({dtype, T, N, K, D, capacity}, seed += 10);
        }
      }
#endif
}

#if defined(MOE_HAVE_CUDA)
std::vector<uint8_t> download_bytes(const DeviceBuffer& b) {
  std::vector<uint8_t> out(b.bytes());
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(out.data(), b.tensor().data, b.bytes(), cudaMemcpyDeviceToHost));
  return out;
}

// scatter_rows_to_routes_fp8 against the CPU: codes and scales of every kept route's row bit for
// bit, the rows no route names keep the poison (0xff bytes), and a second run writes the same bits.
void check_fp8_scatter(const Case& c, uint64_t seed) {
  SCOPED_TRACE(describe(c));
  const int T = c.T, K = c.K, D = c.D;
  const int64_t tiles = (D + kFp8Tile - 1) / kFp8Tile;
  int64_t rows = 0;
  std::vector<int32_t> index = make_route_index(c, seed, &rows);
  DeviceBuffer index_d(DType::I32, {T * K});
  index_d.upload_i32(index);
  std::vector<float> src = random_rows(static_cast<size_t>(T) * D, c.dtype, seed + 1);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::ldexp(src[i], static_cast<int>(i % 29) - 14);  // many scales
  DeviceBuffer src_d(c.dtype, {T, D});
  src_d.upload(src);

  std::vector<uint8_t> codes_ref(static_cast<size_t>(rows) * D, 0xff);
  std::vector<uint8_t> scales_ref(static_cast<size_t>(rows) * tiles * sizeof(float), 0xff);
  scatter_rows_to_routes_fp8(Fp8Tensor{Tensor(codes_ref.data(), DType::FP8_E4M3, {rows, D}),
                                       Tensor(scales_ref.data(), DType::F32, {rows, tiles}), Fp8Tiles::Rows},
                             f32_tensor(src.data(), {T, D}), i32_tensor(index.data(), {T * K}), K);
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer codes_d(DType::FP8_E4M3, {rows, D}), scales_d(DType::F32, {rows, tiles});
    scatter_rows_to_routes_fp8(Fp8Tensor{codes_d.tensor(), scales_d.tensor(), Fp8Tiles::Rows}, src_d, index_d, K);
    EXPECT_TRUE(download_bytes(codes_d) == codes_ref) << "codes differ from the CPU (run " << run << ")";
    EXPECT_TRUE(download_bytes(scales_d) == scales_ref) << "scales differ from the CPU (run " << run << ")";
  }
}
#endif

// D: 6 and 13 (byte stores), 256 (word stores, whole tiles) and 300 (word stores, a partial tile).
TEST(CudaPermute, Fp8ScatterMatchesCpuBitForBitForF32AndBf16) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  uint64_t seed = 5000;
  for (DType dtype : {DType::F32, DType::BF16})
    for (int T : {1, 37, 4096})
      for (int K : {1, 2, 8})
        for (int D : {6, 13, 256, 300}) {
          const int64_t routes = static_cast<int64_t>(T) * K;
          for (int64_t capacity : {routes, routes * 3 / 4}) check_fp8_scatter({dtype, T, 64, K, D, capacity}, seed += 10);
        }
#endif
}

TEST(CudaPermute, EveryRouteDroppedLeavesZerosAndUntouchedRows) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  for (DType dtype : {DType::F32, DType::BF16}) check_permute({dtype, 37, 64, 2, 13, 0}, 7);
#endif
}

TEST(CudaPermute, RejectsMixedRowDtypes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer out_d(DType::F32, {4, 8}), y_d(DType::BF16, {8, 8}), weights_d(DType::F32, {4, 2}),
      index_d(DType::I32, {8});
  try {
    combine_rows(out_d, y_d, weights_d, index_d, 2, false);
    FAIL() << "combine_rows accepted F32 out with BF16 y";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("share one dtype"), std::string::npos) << e.what();
  }
#endif
}

}  // namespace
}  // namespace moe

// The gathered FP8 operands on the GPU (moe/ops/fp8_gather.h) against the path they replace on the
// same GPU: scatter_rows_to_routes then fp8_quantize_columns (the expert input's columns), and
// combine_rows_backward then fp8_quantize_rows_and_columns (the expert output gradient's rows and
// columns), every byte of the columns (padding included) and of the rows inside the experts'
// segments; and against the CPU's gathered op. BF16 and F32, with dropped routes, empty experts,
// rows no route fills, the model's D = 2048 and D not a multiple of 16 or of 8 (byte loads). Also
// the two
// permute ops this path adds: invert_route_index against the CPU's, combine_rows_weight_grad
// against combine_rows_backward's dweights, bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/rng.h"
#include "moe/ops/fp8.h"
#include "moe/ops/fp8_gather.h"
#include "moe/ops/permute.h"
#include "moe/ops/route.h"
#include "../unit/routing_test_util.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::bytes_of;
using testing::DeviceBuffer;
using testing::expect_same_bytes;

template <typename T>
std::vector<uint8_t> host_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

struct DeviceFp8 {
  DeviceBuffer codes, scales;
  Fp8Tiles tiles;
  explicit DeviceFp8(Shape shape, Fp8Tiles tiles_kind = Fp8Tiles::Rows)
      : codes(DType::FP8_E4M3, shape), scales(DType::F32, fp8_scale_shape(shape, tiles_kind)), tiles(tiles_kind) {
    CUDA_CHECK(cudaMemset(codes.tensor().data, 0x5a, codes.bytes()));
    CUDA_CHECK(cudaMemset(scales.tensor().data, 0x5a, scales.bytes()));
  }
  Fp8Tensor t() const { return {codes.tensor(), scales.tensor(), tiles}; }
};

// A placement of T tokens' top-K routes over N experts clamped at `capacity` rows, made on the CPU
// by the route ops (drops where capacity < T K; rows no route fills where some expert gets fewer).
struct Placement {
  int64_t T, N, K, rows;
  std::vector<int32_t> route_index, offsets, route_of_row;
  Placement(int64_t T_, int64_t N_, int64_t K_, int64_t capacity, uint64_t seed)
      : T(T_), N(N_), K(K_), rows(capacity), route_of_row(capacity) {
    // Expert 1 gets no route: an empty segment.
    testing::CpuPlacement p = testing::place_on_cpu(testing::random_topk(T, N, K, seed, 1), T, N, K, capacity);
    route_index = std::move(p.route_index);
    offsets = std::move(p.offsets);
    invert_route_index(i32_tensor(route_of_row.data(), {rows}), i32_tensor(route_index.data(), {T * K}));
  }
};

std::vector<float> normal_values(int64_t n, float sigma, uint64_t seed, bool bf16) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.normal() * sigma);
  return bf16 ? testing::round_bf16(v) : v;
}

void check_gather(DType dtype, int64_t T, int64_t N, int64_t K, int64_t D, double capacity_factor, uint64_t seed) {
  const bool bf16 = dtype == DType::BF16;
  Placement p(T, N, K, static_cast<int64_t>(capacity_factor * T * K), seed);
  const std::string what = std::string(dtype_name(dtype)) + " T=" + std::to_string(T) + " N=" + std::to_string(N) +
                           " K=" + std::to_string(K) + " D=" + std::to_string(D) + " rows=" + std::to_string(p.rows);
  const std::vector<float> x = normal_values(T * D, 2.0f, seed + 1, bf16);
  const std::vector<float> w = normal_values(T * K, 0.5f, seed + 2, false);
  DeviceBuffer dx(dtype, {T, D}), dw(DType::F32, {T, K}), index(DType::I32, {T * K}), offsets(DType::I32, {N + 1});
  DeviceBuffer route_of_row(DType::I32, {p.rows}), stored(dtype, {p.rows, D}), y(dtype, {p.rows, D});
  dx.upload(x), dw.upload(w), index.upload_i32(p.route_index), offsets.upload_i32(p.offsets);
  y.upload(normal_values(p.rows * D, 1.0f, seed + 3, bf16));
  CUDA_CHECK(cudaMemset(stored.tensor().data, 0, stored.bytes()));

  // The inverse on the GPU equals the CPU's.
  invert_route_index(route_of_row, index);
  expect_same_bytes(bytes_of(route_of_row.tensor()), host_bytes(p.route_of_row), what + " route_of_row");

  const Shape columns{D, fp8_columns_capacity(p.rows, N)}, rows{p.rows, D};
  const int64_t kept = p.offsets.back(), row_tiles = (D + kFp8Tile - 1) / kFp8Tile;
  auto expect_same_rows = [&](const DeviceFp8& got, const DeviceFp8& want, const std::string& name) {
    expect_same_bytes(bytes_of(got.codes.tensor(), kept * D), bytes_of(want.codes.tensor(), kept * D), name + " codes");
    const int64_t scale_bytes = kept * row_tiles * 4;
    expect_same_bytes(bytes_of(got.scales.tensor(), scale_bytes), bytes_of(want.scales.tensor(), scale_bytes),
                      name + " scales");
  };
  auto expect_same = [&](const DeviceFp8& got, const DeviceFp8& want, const std::string& name) {
    expect_same_bytes(bytes_of(got.codes.tensor()), bytes_of(want.codes.tensor()), name + " codes");
    expect_same_bytes(bytes_of(got.scales.tensor()), bytes_of(want.scales.tensor()), name + " scales");
  };

  // The expert input's columns.
  DeviceFp8 in_want(columns, Fp8Tiles::Columns), in_got(columns, Fp8Tiles::Columns);
  scatter_rows_to_routes(stored, dx, index, static_cast<int>(K));
  fp8_quantize_columns(in_want.t(), stored, offsets);
  fp8_quantize_gathered_columns(in_got.t(), GatheredRows{dx, route_of_row, {}, static_cast<int>(K)}, offsets);
  expect_same(in_got, in_want, what + " input columns");

  // The expert output gradient's rows and columns, and the weights' gradient alone.
  DeviceBuffer dweights(DType::F32, {T, K}), dweights_alone(DType::F32, {T, K});
  DeviceFp8 out_rows_want(rows), out_rows_got(rows), out_want(columns, Fp8Tiles::Columns),
      out_got(columns, Fp8Tiles::Columns);
  combine_rows_backward(stored, dweights, dx, y, dw, index, static_cast<int>(K));
  fp8_quantize_rows_and_columns(out_rows_want.t(), out_want.t(), stored, offsets);
  fp8_quantize_gathered_rows_and_columns(out_rows_got.t(), out_got.t(),
                                         GatheredRows{dx, route_of_row, dw, static_cast<int>(K)}, offsets);
  expect_same(out_got, out_want, what + " output gradient columns");
  expect_same_rows(out_rows_got, out_rows_want, what + " output gradient rows");
  combine_rows_weight_grad(dweights_alone, dx, y, index, static_cast<int>(K));
  expect_same_bytes(bytes_of(dweights_alone.tensor()), bytes_of(dweights.tensor()), what + " dweights");

  // The CPU's gathered op (F32 values: the CPU computes in F32).
  if (bf16) return;
  std::vector<float> cpu_x = x, cpu_w = w;
  std::vector<uint8_t> codes(static_cast<size_t>(columns.numel()));
  std::vector<float> scales(static_cast<size_t>(fp8_scale_shape(columns, Fp8Tiles::Columns).numel()));
  const Fp8Tensor cpu_out{Tensor(codes.data(), DType::FP8_E4M3, columns),
                          f32_tensor(scales.data(), fp8_scale_shape(columns, Fp8Tiles::Columns)), Fp8Tiles::Columns};
  const GatheredRows cpu_src{f32_tensor(cpu_x.data(), {T, D}), i32_tensor(p.route_of_row.data(), {p.rows}),
                             f32_tensor(cpu_w.data(), {T, K}), static_cast<int>(K)};
  fp8_quantize_gathered_columns(cpu_out, cpu_src, i32_tensor(p.offsets.data(), {N + 1}));
  expect_same_bytes(bytes_of(out_got.codes.tensor()), codes, what + " output gradient columns codes (CPU)");
  expect_same_bytes(bytes_of(out_got.scales.tensor()), host_bytes(scales),
                    what + " output gradient columns scales (CPU)");
}

TEST(CudaFp8Gather, GatheredOperandsAreThoseOfTheStoredRowsBitForBit) {
  MOE_SKIP_WITHOUT_GPU();
  uint64_t seed = 600;
  for (DType dtype : {DType::BF16, DType::F32}) {
    check_gather(dtype, 2048, 64, 8, 2048, 1.0, seed += 10);   // the model's width; every route kept
    check_gather(dtype, 1000, 16, 4, 160, 0.6, seed += 10);    // drops; a partial feature tile
    check_gather(dtype, 300, 8, 2, 264, 1.3, seed += 10);      // rows no route fills; D % 16 != 0
    check_gather(dtype, 77, 8, 3, 40, 1.0, seed += 10);        // byte loads
    check_gather(dtype, 50, 8, 2, 36, 1.0, seed += 10);        // D % 8 != 0
  }
}
#endif

}  // namespace
}  // namespace moe

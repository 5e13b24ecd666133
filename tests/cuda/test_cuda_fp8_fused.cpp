// The kernels that quantize what they produce against the plain ops they replace.
// SwiGLU forward (moe/ops/fp8_swiglu.h): its output and that output's Rows tiles bit for bit equal
// to swiglu_forward followed by fp8_quantize_rows on the same GPU (the GPU's expf differs from the
// host's in the last bit, so the reference is the GPU's own unfused path; the CPU side of the fused
// op is that composition by definition), at the model's H = 1024, a partial row tile and odd H
// (scalar loads), F32 and BF16. Outputs start poisoned, so every element must be written.
// Its FP8-only form (both layouts over expert segments, no output stored) bit for bit equal to
// swiglu_forward then fp8_quantize_rows_and_columns on the same GPU, with empty segments, rows past
// offsets[G], a partial feature tile, odd H, one segment without offsets, and 40000 rows (every
// staged block refills its stage).
// SwiGLU backward (fp8_swiglu_backward: d(gate/up) in both layouts, never stored) bit for bit equal
// to swiglu_backward then fp8_quantize_rows_and_columns on the same GPU: the staged kernel (BF16, H a
// multiple of 128: the model's H = 1024 with empty segments, rows past offsets[G] and enough tiles
// that every block loops over several; H = 128; one segment without offsets) and the general one
// (H = 192: 16-byte runs, H = 200 and odd H: scalar loads, and F32). Both SwiGLU forms also on
// inputs 8 bytes off a 16-byte boundary, where the staged kernels' cp.async copies cannot run.
// RMSNorm forward (moe/ops/fp8_norm.h): output, rstd and the output's Rows tiles bit for bit equal to
// rmsnorm_forward followed by fp8_quantize_rows on the same GPU, at the model's C = 2048 (the fused
// kernel, BF16 and F32, with a row of zeros and a row far above E4M3's range), a row longer than the
// kernel keeps in registers (C = 4096), and C = 200 (not whole accesses: the unfused fallback).
// FP8 rows re-quantized along the tokens (moe/ops/fp8_requantize.h) against the CPU's
// dequantize-then-quantize, bit for bit, with expert segments (empty ones, rows past offsets[G]),
// K not a multiple of 16, a NaN tile and a zero tile.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/rng.h"
#include "moe/ops/activation.h"
#include "moe/ops/fp8.h"
#include "moe/ops/fp8_norm.h"
#include "moe/ops/fp8_requantize.h"
#include "moe/ops/fp8_swiglu.h"
#include "moe/ops/norm.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::bytes_of;
using testing::DeviceBuffer;
using testing::expect_same_bytes;

std::vector<float> normal_values(int64_t n, float sigma, uint64_t seed, bool bf16) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.normal() * sigma);
  return bf16 ? testing::round_bf16(v) : v;
}

struct DeviceFp8 {
  DeviceBuffer codes, scales;
  Fp8Tiles tiles;
  explicit DeviceFp8(Shape shape, Fp8Tiles tiles_kind = Fp8Tiles::Rows)
      : codes(DType::FP8_E4M3, shape), scales(DType::F32, fp8_scale_shape(shape, tiles_kind)), tiles(tiles_kind) {}
  Fp8Tensor t() const { return {codes.tensor(), scales.tensor(), tiles}; }
};

// The first `rows` rows of a Rows-tiled operand of `cols` features: codes and scales bytes.
void expect_same_rows(const DeviceFp8& got, const DeviceFp8& want, int64_t rows, int64_t cols,
                      const std::string& what) {
  const int64_t row_tiles = (cols + kFp8Tile - 1) / kFp8Tile;
  expect_same_bytes(bytes_of(got.codes.tensor(), rows * cols), bytes_of(want.codes.tensor(), rows * cols),
                    what + " codes");
  const int64_t scale_bytes = rows * row_tiles * static_cast<int64_t>(sizeof(float));
  expect_same_bytes(bytes_of(got.scales.tensor(), scale_bytes), bytes_of(want.scales.tensor(), scale_bytes),
                    what + " scales");
}

std::string describe(DType dtype, int64_t R, int64_t H, const std::vector<int32_t>& counts) {
  std::string s = std::string(dtype_name(dtype)) + " R=" + std::to_string(R) + " H=" + std::to_string(H) + " counts=";
  for (int32_t c : counts) s += std::to_string(c) + ",";
  return s;
}

// A fused kernel's Rows and columns outputs (codes [R, K] and [K, Mp]) beside the reference path's,
// all four starting with the same bytes, so every byte must match: the rows past offsets[G] and the
// padding columns too.
struct BothLayouts {
  DeviceFp8 rows, ref_rows, columns, ref_columns;
  BothLayouts(int64_t R, int64_t K, int64_t Mp)
      : rows({R, K}), ref_rows({R, K}), columns({K, Mp}, Fp8Tiles::Columns), ref_columns({K, Mp}, Fp8Tiles::Columns) {
    for (const DeviceFp8* b : {&rows, &ref_rows, &columns, &ref_columns}) {
      CUDA_CHECK(cudaMemset(b->codes.tensor().data, 0x5a, b->codes.bytes()));
      CUDA_CHECK(cudaMemset(b->scales.tensor().data, 0x5a, b->scales.bytes()));
    }
  }
  void expect_same(const std::string& what) const {
    expect_same_bytes(bytes_of(rows.codes.tensor()), bytes_of(ref_rows.codes.tensor()), what + " rows codes");
    expect_same_bytes(bytes_of(rows.scales.tensor()), bytes_of(ref_rows.scales.tensor()), what + " rows scales");
    expect_same_bytes(bytes_of(columns.codes.tensor()), bytes_of(ref_columns.codes.tensor()), what + " columns codes");
    expect_same_bytes(bytes_of(columns.scales.tensor()), bytes_of(ref_columns.scales.tensor()),
                      what + " columns scales");
  }
};

void check_forward(DType dtype, int64_t R, int64_t H, uint64_t seed) {
  const bool bf16 = dtype == DType::BF16;
  DeviceBuffer gate_up(dtype, {R, 2 * H});
  gate_up.upload(normal_values(R * 2 * H, 3.0f, seed, bf16));
  DeviceBuffer out(dtype, {R, H}), ref_out(dtype, {R, H});
  DeviceFp8 rows({R, H}), ref_rows({R, H});
  fp8_swiglu_forward(out, rows.t(), gate_up);
  swiglu_forward(ref_out, gate_up);
  fp8_quantize_rows(ref_rows.t(), ref_out);
  const std::string what = "forward " + describe(dtype, R, H, {});
  expect_same_bytes(bytes_of(out.tensor()), bytes_of(ref_out.tensor()), what + " output");
  expect_same_rows(rows, ref_rows, R, H, what + " rows");
}

// Inputs `shift` bytes into their allocations (testing::OffsetInput): shift 8 keeps 8-byte alignment
// but takes the staged kernels' 16-byte cp.async copies away (their general fallback runs).
testing::OffsetInput shifted(DType dtype, int64_t rows, int64_t cols, int64_t shift, const std::vector<float>& values) {
  return testing::OffsetInput(dtype, {rows, cols}, shift / static_cast<int64_t>(dtype_size(dtype)), values);
}

// The SwiGLU forward that writes only FP8 (both layouts, over expert segments) against
// swiglu_forward then fp8_quantize_rows_and_columns on the same GPU: every byte of both outputs,
// including the rows past offsets[G] and the padding columns (both buffers start equal).
void check_forward_rows_and_columns(DType dtype, const std::vector<int32_t>& counts, int64_t R, int64_t H,
                                    uint64_t seed, int64_t shift = 0) {
  const bool bf16 = dtype == DType::BF16;
  std::vector<int32_t> offsets{0};
  for (int32_t c : counts) offsets.push_back(offsets.back() + c);
  // No counts: one segment, no offsets (the shared expert and the dense MLP).
  const int64_t G = counts.empty() ? 1 : static_cast<int64_t>(counts.size()), Mp = fp8_columns_capacity(R, G);
  const testing::OffsetInput gate_up = shifted(dtype, R, 2 * H, shift, normal_values(R * 2 * H, 3.0f, seed, bf16));
  DeviceBuffer ref_out(dtype, {R, H}), doff(DType::I32, {G + 1});
  if (!counts.empty()) doff.upload_i32(offsets);
  const Tensor segments = counts.empty() ? Tensor() : doff.tensor();
  const BothLayouts out(R, H, Mp);
  fp8_swiglu_forward_rows_and_columns(out.rows.t(), out.columns.t(), gate_up.tensor(), segments);
  swiglu_forward(ref_out, gate_up.tensor());
  fp8_quantize_rows_and_columns(out.ref_rows.t(), out.ref_columns.t(), ref_out, segments);
  out.expect_same("forward rows and columns " + describe(dtype, R, H, counts) + " shift=" + std::to_string(shift));
}

// fp8_swiglu_backward against swiglu_backward then fp8_quantize_rows_and_columns on the same GPU:
// every byte of both outputs, including the rows past offsets[G] and the padding columns (all
// buffers start equal).
void check_backward_rows_and_columns(DType dtype, const std::vector<int32_t>& counts, int64_t R, int64_t H,
                                     uint64_t seed, int64_t shift = 0) {
  const bool bf16 = dtype == DType::BF16;
  std::vector<int32_t> offsets{0};
  for (int32_t c : counts) offsets.push_back(offsets.back() + c);
  const int64_t G = counts.empty() ? 1 : static_cast<int64_t>(counts.size()), Mp = fp8_columns_capacity(R, G);
  const testing::OffsetInput gate_up = shifted(dtype, R, 2 * H, shift, normal_values(R * 2 * H, 3.0f, seed, bf16));
  const testing::OffsetInput dout = shifted(dtype, R, H, shift, normal_values(R * H, 0.01f, seed + 1000, bf16));
  DeviceBuffer ref_dgu(dtype, {R, 2 * H}), doff(DType::I32, {G + 1});
  if (!counts.empty()) doff.upload_i32(offsets);
  const Tensor segments = counts.empty() ? Tensor() : doff.tensor();
  const BothLayouts out(R, 2 * H, Mp);
  fp8_swiglu_backward(out.rows.t(), out.columns.t(), dout.tensor(), gate_up.tensor(), segments);
  swiglu_backward(ref_dgu, dout.tensor(), gate_up.tensor());
  fp8_quantize_rows_and_columns(out.ref_rows.t(), out.ref_columns.t(), ref_dgu, segments);
  out.expect_same("backward rows and columns " + describe(dtype, R, H, counts) + " shift=" + std::to_string(shift));
}

// 64 expert segments of random sizes (some empty) summing to at most R.
std::vector<int32_t> random_counts(int64_t R, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> counts(64);
  int64_t left = R - 50;  // rows past offsets[G]
  for (int32_t& c : counts) {
    c = rng.uniform() < 0.1 ? 0 : static_cast<int32_t>(std::min<double>(left, rng.uniform() * 2.0 * R / 64));
    left -= c;
  }
  return counts;
}

void check_rmsnorm(DType dtype, int64_t R, int64_t C, uint64_t seed) {
  const bool bf16 = dtype == DType::BF16;
  auto xv = normal_values(R * C, 2.0f, seed, bf16);
  for (int64_t c = 0; c < C; ++c) {
    xv[static_cast<size_t>(c)] = 0.0f;                                  // row 0: zeros
    xv[static_cast<size_t>(C + c)] = bf16 ? 1.0e4f * (1 + c % 3) : 3.0e4f;  // row 1: large, equal-ish
  }
  auto wv = normal_values(C, 1.0f, seed + 1, bf16);
  wv[0] = 600.0f;  // one weight past E4M3's largest value: that tile's scale grows
  DeviceBuffer x(dtype, {R, C}), w(dtype, {C}), out(dtype, {R, C}), ref_out(dtype, {R, C});
  DeviceBuffer rstd(DType::F32, {R}), ref_rstd(DType::F32, {R});
  x.upload(xv);
  w.upload(wv);
  DeviceFp8 rows({R, C}), ref_rows({R, C});
  fp8_rmsnorm_forward(out, rstd, rows.t(), x, w, 1e-5f);
  rmsnorm_forward(ref_out, ref_rstd, x, w, 1e-5f);
  fp8_quantize_rows(ref_rows.t(), ref_out);
  const std::string what = "rmsnorm " + describe(dtype, R, C, {});
  expect_same_bytes(bytes_of(out.tensor()), bytes_of(ref_out.tensor()), what + " output");
  expect_same_bytes(bytes_of(rstd.tensor()), bytes_of(ref_rstd.tensor()), what + " rstd");
  expect_same_rows(rows, ref_rows, R, C, what + " rows");
}

// x: F32 values quantized on the CPU into Rows tiles (a NaN tile and a zero tile among them), then
// re-quantized along the tokens on both devices.
void check_requantize(DType values, const std::vector<int32_t>& counts, int64_t M, int64_t K, uint64_t seed) {
  std::vector<int32_t> offsets{0};
  for (int32_t c : counts) offsets.push_back(offsets.back() + c);
  const int64_t G = counts.empty() ? 1 : static_cast<int64_t>(counts.size());
  const int64_t Mp = fp8_columns_capacity(M, G);
  std::vector<float> x = normal_values(M * K, 1.0f, seed, false);
  for (int64_t m = 0; m < M; ++m)  // a binade per row, so the rows' scales differ
    for (int64_t k = 0; k < K; ++k) x[m * K + k] = std::ldexp(x[m * K + k], static_cast<int>(m % 31) - 15);
  if (M > 4 && K > 2) x[4 * K + 1] = std::numeric_limits<float>::quiet_NaN();
  if (M > 6) std::fill(x.begin() + 6 * K, x.begin() + std::min<int64_t>(7 * K, 6 * K + 128), 0.0f);
  const Shape scale_shape = fp8_scale_shape({M, K}, Fp8Tiles::Rows);
  std::vector<uint8_t> codes(static_cast<size_t>(M * K));
  std::vector<float> scales(static_cast<size_t>(scale_shape.numel()));
  const Fp8Tensor host_rows{Tensor(codes.data(), DType::FP8_E4M3, {M, K}), f32_tensor(scales.data(), scale_shape),
                            Fp8Tiles::Rows};
  fp8_quantize_rows(host_rows, f32_tensor(x.data(), {M, K}));
  const Tensor host_offsets = counts.empty() ? Tensor() : i32_tensor(offsets.data(), {G + 1});
  std::vector<uint8_t> want_codes(static_cast<size_t>(K * Mp));
  std::vector<float> want_scales(static_cast<size_t>(fp8_scale_shape({K, Mp}, Fp8Tiles::Columns).numel()));
  fp8_requantize_columns({Tensor(want_codes.data(), DType::FP8_E4M3, {K, Mp}),
                          f32_tensor(want_scales.data(), fp8_scale_shape({K, Mp}, Fp8Tiles::Columns)),
                          Fp8Tiles::Columns},
                         host_rows, values, host_offsets);

  DeviceFp8 rows({M, K}), columns({K, Mp}, Fp8Tiles::Columns);
  CUDA_CHECK(cudaMemcpy(rows.codes.tensor().data, codes.data(), codes.size(), cudaMemcpyHostToDevice));
  rows.scales.upload(scales);
  DeviceBuffer doff(DType::I32, {G + 1});
  if (!counts.empty()) doff.upload_i32(offsets);
  fp8_requantize_columns(columns.t(), rows.t(), values, counts.empty() ? Tensor() : doff.tensor());
  const std::string what = "requantize " + describe(values, M, K, counts);
  std::vector<uint8_t> want_scale_bytes(want_scales.size() * sizeof(float));
  std::memcpy(want_scale_bytes.data(), want_scales.data(), want_scale_bytes.size());
  expect_same_bytes(bytes_of(columns.codes.tensor()), want_codes, what + " codes");
  expect_same_bytes(bytes_of(columns.scales.tensor()), want_scale_bytes, what + " scales");
}

TEST(CudaFp8Swiglu, ForwardWritesTheOutputAndItsRowsTilesOfTheUnfusedPath) {
  MOE_SKIP_WITHOUT_GPU();
  uint64_t seed = 300;
  for (DType dtype : {DType::BF16, DType::F32}) {
    check_forward(dtype, 300, 1024, ++seed);  // the model's expert width
    check_forward(dtype, 37, 200, ++seed);    // a partial row tile
    check_forward(dtype, 5, 7, ++seed);       // odd H: scalar loads and stores
  }
}

TEST(CudaFp8Swiglu, ForwardRowsAndColumnsAreThoseOfTheUnfusedPath) {
  MOE_SKIP_WITHOUT_GPU();
  uint64_t seed = 350;
  for (DType dtype : {DType::BF16, DType::F32}) {
    check_forward_rows_and_columns(dtype, {257, 0, 0, 3, 128, 127, 0, 1000}, 1600, 1024, ++seed);  // rows past o_G
    check_forward_rows_and_columns(dtype, {130, 0, 1, 250}, 381, 200, ++seed);  // a partial feature tile
    check_forward_rows_and_columns(dtype, {5, 2}, 7, 7, ++seed);               // odd H: scalar loads
    check_forward_rows_and_columns(dtype, {}, 300, 4096, ++seed);              // one segment, no offsets
    const std::vector<int32_t> counts = random_counts(40000, ++seed);
    check_forward_rows_and_columns(dtype, counts, 40000, 1024, ++seed);  // every block refills its stage
    check_forward_rows_and_columns(dtype, {257, 0, 3, 1000}, 1300, 1024, ++seed, 8);  // off 16 bytes: fallback
  }
}

TEST(CudaFp8Swiglu, BackwardRowsAndColumnsAreThoseOfTheUnfusedPath) {
  MOE_SKIP_WITHOUT_GPU();
  uint64_t seed = 370;
  for (DType dtype : {DType::BF16, DType::F32}) {
    check_backward_rows_and_columns(dtype, {257, 0, 0, 3, 128, 127, 0, 1000}, 1600, 1024, ++seed);  // rows past o_G
    const std::vector<int32_t> counts = random_counts(40000, ++seed);
    check_backward_rows_and_columns(dtype, counts, 40000, 1024, ++seed);  // many tiles per block
    check_backward_rows_and_columns(dtype, {130, 0, 1, 250}, 381, 128, ++seed);   // one unit tile
    check_backward_rows_and_columns(dtype, {130, 0, 1, 250}, 381, 200, ++seed);   // H % 128 != 0: general kernel
    check_backward_rows_and_columns(dtype, {130, 0, 1, 250}, 381, 192, ++seed);   // general, 16-byte runs
    check_backward_rows_and_columns(dtype, {5, 2}, 7, 7, ++seed);                 // odd H: scalar loads
    check_backward_rows_and_columns(dtype, {}, 300, 1024, ++seed);                // one segment, no offsets
    check_backward_rows_and_columns(dtype, {257, 0, 3, 1000}, 1300, 1024, ++seed, 8);  // off 16 bytes: fallback
  }
}

TEST(CudaFp8Rmsnorm, ForwardWritesTheOutputAndItsRowsTilesOfTheUnfusedPath) {
  MOE_SKIP_WITHOUT_GPU();
  uint64_t seed = 400;
  for (DType dtype : {DType::BF16, DType::F32}) {
    check_rmsnorm(dtype, 1000, 2048, ++seed);  // the model's hidden size: the fused kernel
    check_rmsnorm(dtype, 37, 4096, ++seed);    // past the registers' chunks
    check_rmsnorm(dtype, 9, 200, ++seed);      // not whole accesses: the unfused fallback
  }
}

TEST(CudaFp8Requantize, RowsToColumnsMatchTheCpuDequantizeThenQuantizeBitForBit) {
  MOE_SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  for (DType values : {DType::BF16, DType::F32}) {
    check_requantize(values, {}, 300, 2048, ++seed);
    check_requantize(values, {257, 0, 0, 3, 128, 127, 0, 1000}, 1600, 512, ++seed);  // rows past offsets[G]
    check_requantize(values, {0, 130, 0, 1, 250}, 400, 40, ++seed);  // K % 16 != 0: byte loads
  }
}
#endif

}  // namespace
}  // namespace moe

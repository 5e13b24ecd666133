// The argument checks of the FP8 ops (ops/fp8.cpp, ops/fp8_swiglu.cpp, ops/fp8_norm.cpp,
// ops/fp8_adamw.cpp, ops/fp8_requantize.cpp):
// each bad argument is refused with a message naming the op, the argument and what was expected,
// before any data is touched; and the two layout helpers (fp8_scale_shape, fp8_columns_capacity).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moe/ops/fp8.h"
#include "moe/ops/fp8_adamw.h"
#include "moe/ops/fp8_norm.h"
#include "moe/ops/fp8_requantize.h"
#include "moe/ops/fp8_swiglu.h"
#include "moe/ops/norm.h"

namespace moe {
namespace {

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& message, const std::vector<std::string>& parts) {
  ASSERT_FALSE(message.empty()) << "no error";
  for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
}

// Buffers large enough for every tensor below; the checks read only metadata (and CPU offsets).
std::vector<float> g_f32(1 << 16);
std::vector<uint8_t> g_u8(1 << 16);
float g_dummy[4];

Tensor f32(Shape s) { return f32_tensor(g_f32.data(), s); }
Tensor codes(Shape s) { return Tensor(g_u8.data(), DType::FP8_E4M3, s); }
Fp8Tensor fp8(Shape s, Fp8Tiles tiles) { return {codes(s), f32(fp8_scale_shape(s, tiles)), tiles}; }
Fp8Tensor rows(Shape s) { return fp8(s, Fp8Tiles::Rows); }
Fp8Tensor blocks(Shape s) { return fp8(s, Fp8Tiles::Blocks); }
Fp8Tensor columns(Shape s) { return fp8(s, Fp8Tiles::Columns); }

TEST(Fp8Layout, scale_shape_counts_tiles_and_keeps_leading_dims) {
  EXPECT_EQ(fp8_scale_shape({5, 300}, Fp8Tiles::Rows), (Shape{5, 3}));
  EXPECT_EQ(fp8_scale_shape({200, 300}, Fp8Tiles::Blocks), (Shape{2, 3}));
  EXPECT_EQ(fp8_scale_shape({4, 128, 256}, Fp8Tiles::Blocks), (Shape{4, 1, 2}));
  EXPECT_EQ(fp8_scale_shape({7, 0}, Fp8Tiles::Rows), (Shape{7, 0}));
  expect_contains(error_of([] { fp8_scale_shape({300}, Fp8Tiles::Rows); }), {"fp8_scale_shape", "rank >= 2"});
  // Columns: codes [K, Mp] -> scales [ceil(Mp / 128), K], tile-major.
  EXPECT_EQ(fp8_scale_shape({40, 384}, Fp8Tiles::Columns), (Shape{3, 40}));
  EXPECT_EQ(fp8_scale_shape({40, 300}, Fp8Tiles::Columns), (Shape{3, 40}));
  expect_contains(error_of([] { fp8_scale_shape({2, 40, 384}, Fp8Tiles::Columns); }),
                  {"fp8_scale_shape", "Columns codes must be [K, Mp]"});
}

TEST(Fp8Layout, columns_capacity_bounds_every_split_into_padded_segments) {
  EXPECT_EQ(fp8_columns_capacity(0, 1), 0);
  EXPECT_EQ(fp8_columns_capacity(1, 1), 128);
  EXPECT_EQ(fp8_columns_capacity(300, 4), 384 + 3 * 128);
  // Worst split of 300 rows into 4 segments of 1 row each, 3 rows and so on: never past the bound.
  for (int a = 0; a <= 300; a += 7)
    for (int b = 0; a + b <= 300; b += 13)
      for (int c = 0; a + b + c <= 300; c += 29) {
        const int d = 300 - a - b - c;
        int64_t end = 0;
        for (int rows : {a, b, c, d}) end += (rows + 127) / 128 * 128;
        ASSERT_LE(end, fp8_columns_capacity(300, 4)) << a << " " << b << " " << c << " " << d;
      }
  expect_contains(error_of([] { fp8_columns_capacity(10, 0); }), {"fp8_columns_capacity", "segments >= 1"});
}

TEST(Fp8OpChecks, quantize_refuses_wrong_scale_shapes_dtypes_tiles_and_shapes) {
  const Tensor x = f32({5, 300});
  expect_contains(error_of([&] { fp8_quantize_rows({codes({5, 300}), f32({5, 2}), Fp8Tiles::Rows}, x); }),
                  {"fp8_quantize_rows", "out.scales", "[5, 2]", "expected [5, 3]"});
  expect_contains(error_of([&] { fp8_quantize_rows({f32({5, 300}), f32({5, 3}), Fp8Tiles::Rows}, x); }),
                  {"fp8_quantize_rows", "out.codes", "must be F8_E4M3", "got F32"});
  expect_contains(error_of([&] { fp8_quantize_rows(blocks({5, 300}), x); }),
                  {"fp8_quantize_rows", "out has Blocks", "expected Rows"});
  expect_contains(error_of([&] { fp8_quantize_rows(rows({5, 256}), x); }),
                  {"fp8_quantize_rows", "out.codes", "must match x"});
  expect_contains(error_of([&] { fp8_quantize_rows(rows({5, 300}), Tensor(g_u8.data(), DType::I32, {5, 300})); }),
                  {"fp8_quantize_rows", "x must be F32 or BF16", "I32"});
  Fp8Tensor bad_scales = rows({5, 300});
  bad_scales.scales.dtype = DType::BF16;
  expect_contains(error_of([&] { fp8_quantize_rows(bad_scales, x); }), {"out.scales", "must be F32"});
  expect_contains(error_of([&] { fp8_quantize_rows(rows({5, 300}), Tensor(g_dummy, DType::F32, {5, 300},
                                                                            Device::CUDA)); }),
                  {"fp8_quantize_rows", "out.codes", "is on cpu, expected cuda"});
}

TEST(Fp8OpChecks, quantize_columns_refuses_too_few_columns_and_bad_offsets) {
  const Tensor x = f32({300, 40});
  std::vector<int32_t> offsets = {0, 100, 250};
  const Tensor off = i32_tensor(offsets.data(), {3});
  expect_contains(error_of([&] { fp8_quantize_columns(columns({40, 384}), x, off); }),
                  {"fp8_quantize_columns", "out.codes", "Mp >= 512", "fp8_columns_capacity(300 rows, 2 segments)"});
  expect_contains(error_of([&] { fp8_quantize_columns(columns({41, 512}), x, off); }),
                  {"fp8_quantize_columns", "expected [40, Mp]"});
  expect_contains(error_of([&] { fp8_quantize_columns(rows({40, 512}), x, off); }),
                  {"fp8_quantize_columns", "out has Rows", "expected Columns"});
  std::vector<int32_t> late_start = {5, 100, 250}, decreasing = {0, 100, 90}, too_many = {0, 100, 301};
  expect_contains(error_of([&] { fp8_quantize_columns(columns({40, 512}), x, i32_tensor(late_start.data(), {3})); }),
                  {"fp8_quantize_columns", "offsets[0] = 5", "expected 0"});
  expect_contains(error_of([&] { fp8_quantize_columns(columns({40, 512}), x, i32_tensor(decreasing.data(), {3})); }),
                  {"fp8_quantize_columns", "offsets decrease at segment 1"});
  expect_contains(error_of([&] { fp8_quantize_columns(columns({40, 512}), x, i32_tensor(too_many.data(), {3})); }),
                  {"fp8_quantize_columns", "offsets[2] = 301", "exceeds the 300 rows"});
  expect_contains(error_of([&] { fp8_quantize_columns(columns({40, 512}), x, f32({3})); }),
                  {"fp8_quantize_columns", "offsets must be I32"});
}

TEST(Fp8OpChecks, quantize_blocks_refuses_a_wrong_transposed_shape_or_input) {
  const Tensor w = f32({2, 200, 300});
  expect_contains(error_of([&] { fp8_quantize_blocks(blocks({2, 200, 300}), blocks({2, 200, 300}), w); }),
                  {"fp8_quantize_blocks", "out_t.codes", "expected [2, 300, 200]"});
  expect_contains(error_of([&] { fp8_quantize_blocks(rows({400, 300}), Fp8Tensor{}, f32({400, 300})); }),
                  {"fp8_quantize_blocks", "out has Rows", "expected Blocks"});
  expect_contains(error_of([&] { fp8_quantize_blocks(blocks({200, 300}), Fp8Tensor{},
                                                     Tensor(g_u8.data(), DType::BF16, {200, 300})); }),
                  {"fp8_quantize_blocks", "w must be F32", "got BF16"});
  expect_contains(error_of([&] { fp8_quantize_blocks(blocks({200, 300}), Fp8Tensor{}, f32({300})); }),
                  {"fp8_quantize_blocks", "w must be [N, K] or [E, N, K]"});
}

TEST(Fp8OpChecks, dequantize_refuses_a_shape_mismatch_or_integer_output) {
  expect_contains(error_of([&] { fp8_dequantize(f32({5, 299}), rows({5, 300})); }),
                  {"fp8_dequantize", "out", "must match in.codes"});
  expect_contains(error_of([&] { fp8_dequantize(Tensor(g_u8.data(), DType::I32, {5, 300}), rows({5, 300})); }),
                  {"fp8_dequantize", "out must be F32 or BF16"});
  expect_contains(error_of([&] { fp8_dequantize(f32({2, 5, 300}), rows({2, 5, 300})); }),
                  {"fp8_dequantize", "in.codes must be 2-D"});
}

TEST(Fp8OpChecks, matmul_refuses_mismatched_inner_dims_output_shape_and_tiles) {
  expect_contains(error_of([&] { fp8_matmul(f32({5, 7}), rows({5, 300}), blocks({7, 256}), false); }),
                  {"fp8_matmul", "b.codes [7, 256]", "a.codes [5, 300]", "inner dimension"});
  expect_contains(error_of([&] { fp8_matmul(f32({5, 8}), rows({5, 300}), blocks({7, 300}), false); }),
                  {"fp8_matmul", "c has shape [5, 8]", "expected [5, 7]"});
  expect_contains(error_of([&] { fp8_matmul(f32({5, 7}), blocks({5, 300}), blocks({7, 300}), false); }),
                  {"fp8_matmul", "a has Blocks", "expected Rows"});
  expect_contains(error_of([&] { fp8_matmul(Tensor(g_u8.data(), DType::BF16, {5, 7}), rows({5, 300}),
                                            blocks({7, 300}), false); }),
                  {"fp8_matmul", "c must be F32", "the CPU computes in F32"});
  Fp8Tensor b = blocks({7, 300});
  b.scales = f32({7, 3});  // Rows-shaped scales on Blocks codes
  expect_contains(error_of([&] { fp8_matmul(f32({5, 7}), rows({5, 300}), b, false); }),
                  {"fp8_matmul", "b.scales", "[7, 3]", "expected [1, 3]"});
}

TEST(Fp8OpChecks, grouped_matmul_refuses_bad_weights_and_offsets) {
  std::vector<int32_t> offsets = {0, 3, 10};
  const Tensor off = i32_tensor(offsets.data(), {3});
  expect_contains(error_of([&] { fp8_grouped_matmul(f32({10, 64}), rows({10, 128}), rows({2 * 64, 128}), off); }),
                  {"fp8_grouped_matmul", "b has Rows", "expected Blocks"});
  expect_contains(error_of([&] { fp8_grouped_matmul(f32({10, 64}), rows({10, 128}), blocks({2, 64, 100}), off); }),
                  {"fp8_grouped_matmul", "inner dimension"});
  expect_contains(error_of([&] { fp8_grouped_matmul(f32({10, 65}), rows({10, 128}), blocks({2, 64, 128}), off); }),
                  {"fp8_grouped_matmul", "c has 65 columns, expected 64"});
  expect_contains(error_of([&] { fp8_grouped_matmul(f32({10, 64}), rows({10, 128}), blocks({3, 64, 128}), off); }),
                  {"fp8_grouped_matmul", "expert_offsets has shape [3]", "expected [4]"});
  expect_contains(error_of([&] { fp8_grouped_matmul(f32({9, 64}), rows({10, 128}), blocks({2, 64, 128}), off); }),
                  {"fp8_grouped_matmul", "expert_offsets[2] = 10", "exceeds the 9 buffer rows"});
}

TEST(Fp8OpChecks, grouped_wgrad_refuses_mismatched_columns_and_segments_past_them) {
  std::vector<int32_t> offsets = {0, 3, 132};  // padded segments end at 128 + 256 = 384
  const Tensor off = i32_tensor(offsets.data(), {3});
  const Tensor db = f32({2, 16, 8});
  expect_contains(error_of([&] { fp8_grouped_matmul_wgrad(db, columns({16, 384}), columns({8, 256}), off, false); }),
                  {"fp8_grouped_matmul_wgrad", "dc_t.codes [16, 384]", "x_t.codes [8, 256]", "same columns"});
  expect_contains(error_of([&] { fp8_grouped_matmul_wgrad(db, columns({16, 256}), columns({8, 256}), off, false); }),
                  {"fp8_grouped_matmul_wgrad", "end at column 384", "past the 256 columns"});
  expect_contains(error_of([&] { fp8_grouped_matmul_wgrad(db, columns({15, 384}), columns({8, 384}), off, false); }),
                  {"fp8_grouped_matmul_wgrad", "dc_t.codes has 15 rows, expected 16"});
  expect_contains(error_of([&] { fp8_grouped_matmul_wgrad(db, columns({16, 384}), columns({9, 384}), off, false); }),
                  {"fp8_grouped_matmul_wgrad", "x_t.codes has 9 rows, expected 8"});
  expect_contains(error_of([&] { fp8_grouped_matmul_wgrad(f32({3, 16, 8}), columns({16, 384}), columns({8, 384}), off,
                                                          false); }),
                  {"fp8_grouped_matmul_wgrad", "expert_offsets has shape [3]", "expected [4]"});
  expect_contains(error_of([&] { fp8_grouped_matmul_wgrad(db, blocks({16, 384}), columns({8, 384}), off, false); }),
                  {"fp8_grouped_matmul_wgrad", "dc_t has Blocks", "expected Columns"});
  // Rows tiles of the same codes: their scales are laid out K-major, which the product would misread.
  expect_contains(error_of([&] { fp8_grouped_matmul_wgrad(db, columns({16, 384}), rows({8, 384}), off, false); }),
                  {"fp8_grouped_matmul_wgrad", "x_t has Rows", "expected Columns"});
}

// The device's dtype contract applies on CUDA too: checks run before dispatch, so a CUDA build
// refuses these the same way (no data is read from the dummy device buffers).
TEST(Fp8OpChecks, cuda_calls_are_checked_before_dispatch) {
  const auto cuda = [](DType dtype, Shape s) { return Tensor(g_dummy, dtype, s, Device::CUDA); };
  const Fp8Tensor a = {cuda(DType::FP8_E4M3, {5, 300}), cuda(DType::F32, {5, 2}), Fp8Tiles::Rows};
  const Fp8Tensor b = {cuda(DType::FP8_E4M3, {7, 300}), cuda(DType::F32, {1, 3}), Fp8Tiles::Blocks};
  expect_contains(error_of([&] { fp8_matmul(cuda(DType::BF16, {5, 7}), a, b, false); }),
                  {"fp8_matmul", "a.scales", "expected [5, 3]"});
  expect_contains(error_of([&] { fp8_matmul(cuda(DType::I32, {5, 7}), a, b, false); }),
                  {"fp8_matmul", "c must be F32 or BF16 on cuda"});
}

TEST(Fp8OpChecks, swiglu_forward_refuses_operands_that_do_not_match_gate_up) {
  // gate_up [8, 64] is [R, 2H] for H = 32.
  expect_contains(error_of([] { fp8_swiglu_forward(f32({8, 31}), rows({8, 31}), f32({8, 64})); }),
                  {"fp8_swiglu_forward", "gate_up [8, 64] must be [R, 2H] for out [8, 31]"});
  expect_contains(error_of([] { fp8_swiglu_forward(f32({8, 32}), rows({8, 64}), f32({8, 64})); }),
                  {"fp8_swiglu_forward", "out_rows.codes"});
}

TEST(Fp8OpChecks, swiglu_forward_rows_and_columns_refuses_outputs_that_do_not_fit_gate_up) {
  // gate_up [300, 80]: H = 40; two segments of 300 rows need columns [40, Mp >= 512].
  std::vector<int32_t> offsets{0, 100, 300};
  const Tensor off = i32_tensor(offsets.data(), {3});
  const char* op = "fp8_swiglu_forward_rows_and_columns";
  expect_contains(error_of([&] { fp8_swiglu_forward_rows_and_columns(rows({300, 40}), columns({40, 512}), f32({300, 81}),
                                                                     off); }),
                  {op, "gate_up [300, 81] must be [R, 2H]"});
  expect_contains(error_of([&] { fp8_swiglu_forward_rows_and_columns(rows({300, 41}), columns({40, 512}), f32({300, 80}),
                                                                     off); }),
                  {op, "out_rows.codes"});
  expect_contains(error_of([&] { fp8_swiglu_forward_rows_and_columns(rows({300, 40}), columns({40, 384}), f32({300, 80}),
                                                                     off); }),
                  {op, "out_columns.codes", "Mp >= 512"});
  const Tensor i32_gate_up(g_f32.data(), DType::I32, {300, 80});
  expect_contains(error_of([&] { fp8_swiglu_forward_rows_and_columns(rows({300, 40}), columns({40, 512}), i32_gate_up,
                                                                     off); }),
                  {op, "gate_up"});
}

TEST(Fp8OpChecks, swiglu_backward_refuses_operands_that_do_not_fit_gate_up) {
  // gate_up [300, 80]: H = 40, dout [300, 40]; rows [300, 80]; two segments need columns [80, Mp >= 512].
  std::vector<int32_t> offsets{0, 100, 300};
  const Tensor off = i32_tensor(offsets.data(), {3});
  const char* op = "fp8_swiglu_backward";
  expect_contains(error_of([&] { fp8_swiglu_backward(rows({300, 80}), columns({80, 512}), f32({300, 41}), f32({300, 80}),
                                                     off); }),
                  {op, "gate_up [300, 80] must be [R, 2H] for dout [300, 41]"});
  expect_contains(error_of([&] { fp8_swiglu_backward(rows({300, 40}), columns({80, 512}), f32({300, 40}), f32({300, 80}),
                                                     off); }),
                  {op, "rows.codes"});
  expect_contains(error_of([&] { fp8_swiglu_backward(rows({300, 80}), columns({80, 384}), f32({300, 40}), f32({300, 80}),
                                                     off); }),
                  {op, "columns.codes", "Mp >= 512"});
  expect_contains(error_of([&] { fp8_swiglu_backward(rows({300, 80}), blocks({80, 512}), f32({300, 40}),
                                                     f32({300, 80}), off); }),
                  {op, "columns"});
}

TEST(Fp8OpChecks, rmsnorm_forward_refuses_rows_operands_that_do_not_match_x) {
  // x [2, 4, 64] is 8 rows of 64: out_rows must be [8, 64].
  const Tensor x = f32({2, 4, 64}), w = f32({64}), rstd = f32({8});
  expect_contains(error_of([&] { fp8_rmsnorm_forward(f32({2, 4, 64}), rstd, rows({4, 64}), x, w, 1e-5f); }),
                  {"fp8_rmsnorm_forward", "out_rows.codes"});
  expect_contains(error_of([&] { fp8_rmsnorm_forward(f32({2, 4, 64}), rstd, blocks({8, 64}), x, w, 1e-5f); }),
                  {"fp8_rmsnorm_forward", "out_rows"});
  expect_contains(error_of([&] { fp8_rmsnorm_forward(f32({2, 4, 64}), f32({4}), rows({8, 64}), x, w, 1e-5f); }),
                  {"fp8_rmsnorm_forward", "rstd"});
}

TEST(Fp8OpChecks, adamw_quantize_refuses_caches_of_another_shape_and_bad_state) {
  const Tensor p = f32({2, 128, 64}), norm = f32({1});
  AdamWConfig cfg;
  expect_contains(error_of([&] {
                    adamw_step_quantize_blocks(p, f32({2, 128, 64}), f32({2, 128, 64}), f32({2, 128, 64}), norm, 1.0f,
                                               cfg, 1, blocks({2, 64, 128}), blocks({2, 64, 128}));
                  }),
                  {"adamw_step_quantize_blocks", "out.codes"});
  expect_contains(error_of([&] {
                    adamw_step_quantize_blocks(p, f32({2, 128, 64}), f32({2, 128, 64}), f32({2, 128, 64}), norm, 1.0f,
                                               cfg, 1, blocks({2, 128, 64}), blocks({2, 128, 64}));
                  }),
                  {"adamw_step_quantize_blocks", "out_t.codes"});
  expect_contains(error_of([&] {
                    adamw_step_quantize_blocks(p, f32({2, 128, 32}), f32({2, 128, 64}), f32({2, 128, 64}), norm, 1.0f,
                                               cfg, 1, blocks({2, 128, 64}), blocks({2, 64, 128}));
                  }),
                  {"adamw_step_quantize_blocks", "grad"});
  expect_contains(error_of([&] {
                    adamw_step_quantize_blocks(p, f32({2, 128, 64}), f32({2, 128, 64}), f32({2, 128, 64}), norm, 1.0f,
                                               cfg, 0, blocks({2, 128, 64}), blocks({2, 64, 128}));
                  }),
                  {"adamw_step_quantize_blocks", "step = 0"});
}

// On the CPU the fused ops are, by definition, the plain ops one after the other: the update and
// then the caches of the new weights; the norm and then the rows of its output (3-D x included).
TEST(Fp8FusedOps, cpu_fused_ops_equal_their_two_steps) {
  std::vector<float> x(3 * 5 * 256), w(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((static_cast<int>(i * 37 % 101) - 50) * 0.01);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f + static_cast<float>(i % 7) * 0.1f;
  std::vector<float> out(x.size()), ref(x.size()), rstd(15), ref_rstd(15), scales(15 * 2), ref_scales(15 * 2);
  std::vector<uint8_t> codes(x.size()), ref_codes(x.size());
  const Shape xs{3, 5, 256};
  fp8_rmsnorm_forward(f32_tensor(out.data(), xs), f32_tensor(rstd.data(), {15}),
                      {Tensor(codes.data(), DType::FP8_E4M3, {15, 256}), f32_tensor(scales.data(), {15, 2})},
                      f32_tensor(x.data(), xs), f32_tensor(w.data(), {256}), 1e-5f);
  rmsnorm_forward(f32_tensor(ref.data(), xs), f32_tensor(ref_rstd.data(), {15}), f32_tensor(x.data(), xs),
                  f32_tensor(w.data(), {256}), 1e-5f);
  fp8_quantize_rows({Tensor(ref_codes.data(), DType::FP8_E4M3, {15, 256}), f32_tensor(ref_scales.data(), {15, 2})},
                    f32_tensor(ref.data(), {15, 256}));
  EXPECT_EQ(out, ref);
  EXPECT_EQ(rstd, ref_rstd);
  EXPECT_EQ(codes, ref_codes);
  EXPECT_EQ(scales, ref_scales);
}

TEST(Fp8OpChecks, requantize_columns_refuses_a_values_type_and_columns_that_do_not_fit) {
  // x: 300 rows of 40 features as Rows tiles; its columns operand is [40, Mp >= 384].
  expect_contains(error_of([] { fp8_requantize_columns(columns({40, 384}), rows({300, 40}), DType::I32, {}); }),
                  {"fp8_requantize_columns", "values must be F32 or BF16"});
  expect_contains(error_of([] { fp8_requantize_columns(columns({40, 256}), rows({300, 40}), DType::BF16, {}); }),
                  {"fp8_requantize_columns", "out.codes", "Mp >= 384"});
  expect_contains(error_of([] { fp8_requantize_columns(columns({40, 384}), blocks({300, 40}), DType::BF16, {}); }),
                  {"fp8_requantize_columns", "x has Blocks"});
}

}  // namespace
}  // namespace moe

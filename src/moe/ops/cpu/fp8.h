// CPU FP8 ops (semantics and layouts: moe/ops/fp8.h; ops/fp8.cpp checks the arguments). The
// quantize functions write the GPU's bits (the scalar code of moe/core/fp8.h); the products are the
// exact emulation: both operands dequantized to FP32 (exact) and multiplied by OpenBLAS sgemm.
#pragma once

#include <cstdint>

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"

namespace moe::cpu {

void fp8_quantize_rows(Fp8Tensor out, Tensor x, Stream stream = {});
void fp8_quantize_columns(Fp8Tensor out, Tensor x, Tensor offsets, Stream stream = {});
void fp8_quantize_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, Tensor x, Tensor offsets, Stream stream = {});
// One row x[0, K) (F32) into codes[0, K) and scales[0, ceil(K / 128)): fp8_quantize_rows' bits for that
// row (the FP8 dispatch quantizes each token row on its way, ops/cpu/route_rows.h).
void fp8_quantize_row(const float* x, int64_t K, uint8_t* codes, float* scales);
void fp8_quantize_blocks(Fp8Tensor out, Fp8Tensor out_t, Tensor w, Stream stream = {});
void fp8_dequantize(Tensor out, Fp8Tensor in, Stream stream = {});

// Rows [row_begin, row_end) of in's codes read as a matrix [rows, K] (leading dims folded),
// dequantized into out (F32, row-major [row_end - row_begin, K]): the products' operands.
void fp8_dequantize_rows_f32(const Fp8Tensor& in, int64_t row_begin, int64_t row_end, float* out);

void fp8_matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, bool accumulate, Stream stream = {});

void fp8_grouped_matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, Tensor expert_offsets, Stream stream = {});
void fp8_grouped_matmul_wgrad(Tensor db, Fp8Tensor dc_t, Fp8Tensor x_t, Tensor expert_offsets, bool accumulate,
                              Stream stream = {});

}  // namespace moe::cpu

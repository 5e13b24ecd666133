// Argument checks shared by the FP8 ops (moe/ops/fp8.h) and the ops that quantize what they
// produce (moe/ops/fp8_swiglu.h). Each names the op and the argument in its error.
#pragma once

#include <cstdint>

#include "moe/ops/fp8.h"
#include "moe/ops/op_checks.h"

namespace moe {

// The FP8 operand `name`: its tiles kind, codes (FP8_E4M3, rank in [min_ndim, max_ndim]) and scales
// (F32, exactly fp8_scale_shape of the codes).
void check_fp8(const OpCheck& check, const char* name, const Fp8Tensor& t, Fp8Tiles tiles, int min_ndim,
               int max_ndim);

// x (an input to quantize) or out (a dequantized result): F32 or BF16 on either device.
void check_f32_or_bf16(const OpCheck& check, const char* name, const Tensor& t);

// `name` holds the columns operand (moe/ops/fp8.h) of M rows of K features in the segments of offsets
// (empty: one segment): Rows tiles, codes [K, Mp] with Mp >= fp8_columns_capacity(M, G).
void check_columns_layout(const OpCheck& check, const char* name, const Fp8Tensor& out, int64_t M, int64_t K,
                          const Tensor& offsets);

// check_columns_layout for the columns of the tensor x [M, K] (F32 or BF16).
void check_columns_operand(const OpCheck& check, const char* name, const Fp8Tensor& out, const Tensor& x,
                           const Tensor& offsets);

// The weight caches of w (named w_name in errors; [N, K] or [E, N, K], F32): out Blocks tiles with
// w's shape and, unless out_t.codes is a default Tensor (the transposed orientation not asked for),
// out_t Blocks tiles with w's last two dims swapped.
void check_block_caches(const OpCheck& check, const Fp8Tensor& out, const Fp8Tensor& out_t, const Tensor& w,
                        const char* w_name = "w");

}  // namespace moe

// CUDA FP8 ops (semantics and layouts: moe/ops/fp8.h; ops/fp8.cpp checks the arguments). Hopper
// (sm_90) only: the products run on the FP8 tensor cores. The quantize kernels (fp8_quantize.cu) use
// the scalar code of moe/core/fp8.h, so they write the CPU's bits; the dense product
// (fp8_gemm.cu) is cuBLASLt's block-scaled FP8 matmul; the expert products (fp8_grouped_gemm.cu) are
// CUTLASS's Hopper ptr-array grouped GEMM with blockwise scaling.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"

namespace moe::cuda {

void fp8_quantize_rows(Fp8Tensor out, Tensor x, Stream stream);
void fp8_quantize_columns(Fp8Tensor out, Tensor x, Tensor offsets, Stream stream);
void fp8_quantize_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, Tensor x, Tensor offsets, Stream stream);
void fp8_quantize_blocks(Fp8Tensor out, Fp8Tensor out_t, Tensor w, Stream stream);
void fp8_dequantize(Tensor out, Fp8Tensor in, Stream stream);

void fp8_matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, bool accumulate, Stream stream);

void fp8_grouped_matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, Tensor expert_offsets, Stream stream);
void fp8_grouped_matmul_wgrad(Tensor db, Fp8Tensor dc_t, Fp8Tensor x_t, Tensor expert_offsets, bool accumulate,
                              Stream stream);

}  // namespace moe::cuda

// The SwiGLU forward (moe/ops/activation.h) that also quantizes its output for the FP8 product that
// reads it next (moe/ops/fp8.h), so train.precision = "fp8" needs no separate quantization pass over
// it. The codes and scales equal those of the plain SwiGLU op followed by the plain quantize op on
// its (BF16 or F32) result, bit for bit on each device; the CPU computes exactly that, the GPU in
// one kernel (moe/ops/cuda/fp8_swiglu.cu).
// The backward's fused form likewise quantizes dgate_up into both layouts and never stores it (the
// CUDA kernel's design and history: moe/ops/cuda/fp8_swiglu_staged.cu).
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"

namespace moe {

// out [R, H] = swiglu(gate_up [R, 2H]) as swiglu_forward writes it, and out_rows (Rows tiles,
// codes [R, H]) = fp8_quantize_rows of out.
void fp8_swiglu_forward(Tensor out, Fp8Tensor out_rows, Tensor gate_up, Stream stream = {});

// The SwiGLU when the backward keeps its output in FP8 (every MLP in train.precision = "fp8" but the
// routed experts under recompute = "experts"): swiglu(gate_up [R, 2H]) in the activation dtype is
// never stored; out_rows (Rows tiles, codes [R, H]) and out_columns (Columns tiles, along the tokens in
// the segments of offsets, empty: one; codes [H, Mp]) are what fp8_quantize_rows_and_columns makes of
// swiglu_forward's output, bit for bit. out_columns is the down product's weight-gradient operand: the
// backward reads it instead of the 2-byte output and its own quantization pass (docs/architecture.md,
// FP8 training).
void fp8_swiglu_forward_rows_and_columns(Fp8Tensor out_rows, Fp8Tensor out_columns, Tensor gate_up, Tensor offsets,
                                         Stream stream = {});

// The SwiGLU backward when its output gradient feeds FP8 products (the gate/up projection's data and
// weight gradients in train.precision = "fp8"): dgate_up = swiglu_backward(dout [R, H], gate_up
// [R, 2H]) is never stored; rows (Rows tiles, codes [R, 2H]) and columns (Columns tiles, along the
// tokens in the segments of offsets, empty: one; codes [2H, Mp]) are what
// fp8_quantize_rows_and_columns makes of it, bit for bit (rows outside the segments may be left
// unwritten, as there).
void fp8_swiglu_backward(Fp8Tensor rows, Fp8Tensor columns, Tensor dout, Tensor gate_up, Tensor offsets,
                         Stream stream = {});

}  // namespace moe

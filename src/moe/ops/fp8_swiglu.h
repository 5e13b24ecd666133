// The SwiGLU forward (moe/ops/activation.h) that also quantizes its output for the FP8 product that
// reads it next (moe/ops/fp8.h), so train.precision = "fp8" needs no separate quantization pass over
// it. The codes and scales equal those of the plain SwiGLU op followed by the plain quantize op on
// its (BF16 or F32) result, bit for bit on each device; the CPU computes exactly that, the GPU in
// one kernel (moe/ops/cuda/fp8_swiglu.cu).
// NOTES: the backward's fused form (dgate_up quantized into both layouts as the SwiGLU backward
// computes it, never stored) was built and measured slower than the plain SwiGLU backward plus
// fp8_quantize_rows_and_columns on the H200 (2.04 against 1.84 ms per bench-olmoe-4l layer): the
// columns quantizer takes 128 features of one half per block, so the gate and the up blocks each
// load gate, up and dout, six times the plain kernel's loads per output. It needs a kernel whose
// warps produce a unit's gate and up gradients together (two row tiles per block).
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
// never stored; out_rows (Rows tiles, codes [R, H]) and out_columns (Rows tiles along the tokens in
// the segments of offsets, empty: one; codes [H, Mp]) are what fp8_quantize_rows_and_columns makes of
// swiglu_forward's output, bit for bit. out_columns is the down product's weight-gradient operand: the
// backward reads it instead of the 2-byte output and its own quantization pass (docs/architecture.md,
// FP8 training).
void fp8_swiglu_forward_rows_and_columns(Fp8Tensor out_rows, Fp8Tensor out_columns, Tensor gate_up, Tensor offsets,
                                         Stream stream = {});

}  // namespace moe

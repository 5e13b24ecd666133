// SwiGLU (moe/ops/activation.h) that also quantizes what it produces for the FP8 product that reads
// it next (moe/ops/fp8.h), so train.precision = "fp8" needs no separate quantization pass over the
// SwiGLU's output or its gradient. The codes and scales equal those of the plain SwiGLU op
// followed by the plain quantize op on its (BF16 or F32) result, bit for bit on each device; the
// CPU computes exactly that, the GPU in one kernel each (moe/ops/cuda/fp8_swiglu.cu).
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"

namespace moe {

// out [R, H] = swiglu(gate_up [R, 2H]) as swiglu_forward writes it, and out_rows (Rows tiles,
// codes [R, H]) = fp8_quantize_rows of out.
void fp8_swiglu_forward(Tensor out, Fp8Tensor out_rows, Tensor gate_up, Stream stream = {});

// dgate_up [R, 2H] of swiglu_backward (never stored) quantized as fp8_quantize_rows_and_columns
// quantizes it: rows (codes [R, 2H]) and columns (codes [2H, Mp]) in the segments of offsets (empty:
// one segment). Rows outside every segment (past offsets[G]) may be left unwritten in rows.
void fp8_swiglu_backward(Fp8Tensor rows, Fp8Tensor columns, Tensor dout, Tensor gate_up, Tensor offsets,
                         Stream stream = {});

}  // namespace moe

// The CUDA SwiGLU kernels that quantize what they compute (semantics: moe/ops/fp8_swiglu.h; the
// arguments are checked there).
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"

namespace moe::cuda {

void fp8_swiglu_forward(Tensor out, Fp8Tensor out_rows, Tensor gate_up, Stream stream);
void fp8_swiglu_forward_rows_and_columns(Fp8Tensor out_rows, Fp8Tensor out_columns, Tensor gate_up, Tensor offsets,
                                         Stream stream);
void fp8_swiglu_backward(Fp8Tensor rows, Fp8Tensor columns, Tensor dout, Tensor gate_up, Tensor offsets,
                         Stream stream);

}  // namespace moe::cuda

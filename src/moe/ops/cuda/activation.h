// CUDA SwiGLU. Semantics: moe/ops/activation.h (same signatures); ops/activation.cpp checks the
// arguments.
//
// Dtypes: out, gate_up (forward) and dgate_up, dout, gate_up (backward) share one dtype T, F32 or
// BF16 (__nv_bfloat16); arithmetic in FP32. On the CUDA device, on `stream`, no allocation, no
// synchronization.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe::cuda {

void swiglu_forward(Tensor out, Tensor gate_up, Stream stream = {});
void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, Stream stream = {});
void swiglu_backward_with_output(Tensor dgate_up, Tensor out, Tensor dout, Tensor gate_up, Stream stream = {});

}  // namespace moe::cuda

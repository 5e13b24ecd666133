// CPU SwiGLU. Semantics: moe/ops/activation.h.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe::cpu {

void swiglu_forward(Tensor out, Tensor gate_up, Stream stream);
void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, Stream stream);
void swiglu_backward_with_output(Tensor dgate_up, Tensor out, Tensor dout, Tensor gate_up, Stream stream);

}  // namespace moe::cpu

// SwiGLU on the fused gate/up projection output.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

// gate_up [R, 2H]: columns [0, H) are the gate, [H, 2H) the up projection (the transformers 5
// fused expert layout). out [R, H] = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
void swiglu_forward(Tensor out, Tensor gate_up, Stream stream = {});
// dgate_up [R, 2H] (overwritten) from dout [R, H] and the forward input.
void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, Stream stream = {});
// swiglu_backward that also writes the forward output out [R, H] (the bits swiglu_forward writes)
// in the same pass: recompute = experts gets the dropped SwiGLU output without a second read of
// gate_up.
void swiglu_backward_with_output(Tensor dgate_up, Tensor out, Tensor dout, Tensor gate_up, Stream stream = {});

}  // namespace moe

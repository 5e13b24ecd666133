// The CUDA SwiGLU forward that quantizes what it computes (semantics: moe/ops/fp8_swiglu.h; the
// arguments are checked there).
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"

namespace moe::cuda {

void fp8_swiglu_forward(Tensor out, Fp8Tensor out_rows, Tensor gate_up, Stream stream);

}  // namespace moe::cuda

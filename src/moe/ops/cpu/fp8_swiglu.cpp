// The CPU's fused SwiGLU + FP8 op is the composition it is defined as (moe/ops/fp8_swiglu.h): the
// CPU gains nothing from fusing, and the composition is its meaning.
#include "moe/ops/cpu/fp8_swiglu.h"

#include "moe/ops/cpu/activation.h"
#include "moe/ops/cpu/fp8.h"

namespace moe::cpu {

void fp8_swiglu_forward(Tensor out, Fp8Tensor out_rows, Tensor gate_up, Stream stream) {
  cpu::swiglu_forward(out, gate_up, stream);
  cpu::fp8_quantize_rows(out_rows, out, stream);
}

}  // namespace moe::cpu

// The CPU's fused SwiGLU + FP8 ops are the compositions they are defined as (moe/ops/fp8_swiglu.h):
// the CPU gains nothing from fusing, and the composition is their meaning.
#include "moe/ops/cpu/fp8_swiglu.h"

#include <cstddef>
#include <vector>

#include "moe/ops/cpu/activation.h"
#include "moe/ops/cpu/fp8.h"

namespace moe::cpu {

void fp8_swiglu_forward(Tensor out, Fp8Tensor out_rows, Tensor gate_up, Stream stream) {
  cpu::swiglu_forward(out, gate_up, stream);
  cpu::fp8_quantize_rows(out_rows, out, stream);
}

void fp8_swiglu_forward_rows_and_columns(Fp8Tensor out_rows, Fp8Tensor out_columns, Tensor gate_up, Tensor offsets,
                                         Stream stream) {
  const Shape shape{gate_up.dim(0), gate_up.dim(1) / 2};
  std::vector<std::byte> values(static_cast<size_t>(shape.numel()) * dtype_size(gate_up.dtype));
  const Tensor out(values.data(), gate_up.dtype, shape);
  cpu::swiglu_forward(out, gate_up, stream);
  cpu::fp8_quantize_rows_and_columns(out_rows, out_columns, out, offsets, stream);
}

void fp8_swiglu_backward(Fp8Tensor rows, Fp8Tensor columns, Tensor dout, Tensor gate_up, Tensor offsets,
                         Stream stream) {
  std::vector<std::byte> values(gate_up.nbytes());
  const Tensor dgate_up(values.data(), gate_up.dtype, gate_up.shape);
  cpu::swiglu_backward(dgate_up, dout, gate_up, stream);
  cpu::fp8_quantize_rows_and_columns(rows, columns, dgate_up, offsets, stream);
}

}  // namespace moe::cpu

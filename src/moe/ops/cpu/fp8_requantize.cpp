// The CPU's rows -> columns re-quantization is the composition it is defined as
// (moe/ops/fp8_requantize.h), through a temporary tensor of the values.
#include "moe/ops/cpu/fp8_requantize.h"

#include <cstddef>
#include <vector>

#include "moe/ops/cpu/fp8.h"

namespace moe::cpu {

void fp8_requantize_columns(Fp8Tensor out, Fp8Tensor x, DType values, Tensor offsets, Stream stream) {
  std::vector<std::byte> storage(static_cast<size_t>(x.codes.numel()) * dtype_size(values));
  const Tensor dequantized(storage.data(), values, x.codes.shape, Device::CPU);
  cpu::fp8_dequantize(dequantized, x, stream);
  cpu::fp8_quantize_columns(out, dequantized, offsets, stream);
}

}  // namespace moe::cpu

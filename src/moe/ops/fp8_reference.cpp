#include "moe/ops/fp8_reference.h"

#include "moe/core/device.h"
#include "moe/ops/gemm.h"
#include "moe/ops/grouped_gemm.h"

namespace moe::fp8_reference {
namespace {

// The exact values of `q` in BF16, in memory owned by the returned allocation.
struct Dequantized {
  DeviceAllocation memory;
  Tensor values;
  Dequantized(const Fp8Tensor& q, Stream stream)
      : memory(static_cast<size_t>(q.codes.numel()) * 2, q.codes.device),
        values(memory.data(), DType::BF16, q.codes.shape, q.codes.device) {
    fp8_dequantize(values, q, stream);
  }
};

}  // namespace

void matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, bool accumulate, Stream stream) {
  const Dequantized da(a, stream), db(b, stream);
  moe::matmul(c, da.values, db.values, false, true, 1.0f, accumulate ? 1.0f : 0.0f, stream);
}

void grouped_matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, Tensor expert_offsets, Stream stream) {
  const Dequantized da(a, stream), db(b, stream);
  moe::grouped_matmul(c, da.values, db.values, expert_offsets, /*trans_b=*/true, /*accumulate=*/false, stream);
}

}  // namespace moe::fp8_reference

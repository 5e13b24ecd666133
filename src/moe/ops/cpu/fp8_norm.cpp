#include "moe/ops/cpu/fp8_norm.h"

#include "moe/ops/cpu/fp8.h"
#include "moe/ops/cpu/norm.h"

namespace moe::cpu {

// By definition: the norm, then the rows quantization of what it stored (the GPU fuses the two;
// its test compares it with this composition on the GPU, bit for bit).
void fp8_rmsnorm_forward(Tensor out, Tensor rstd, Fp8Tensor out_rows, Tensor x, Tensor weight, float eps,
                         Stream stream) {
  cpu::rmsnorm_forward(out, rstd, x, weight, eps, stream);
  const int64_t C = weight.dim(0);
  cpu::fp8_quantize_rows(out_rows, out.view({C == 0 ? 0 : out.numel() / C, C}), stream);
}

}  // namespace moe::cpu

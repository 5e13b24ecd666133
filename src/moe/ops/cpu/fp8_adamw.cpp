#include "moe/ops/cpu/fp8_adamw.h"

#include <cmath>

#include "moe/ops/cpu/fp8.h"
#include "moe/ops/cpu/optim.h"

namespace moe::cpu {

// By definition: the update, then the caches of the new param (the GPU fuses the two; its test
// compares it with this composition on the GPU, bit for bit).
void adamw_step_quantize_blocks(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                                const AdamWConfig& cfg, int64_t step, Fp8Tensor out, Fp8Tensor out_t, Stream stream,
                                Tensor schedule) {
  if (!std::isfinite(grad_norm_sq.f32()[0])) return;  // the skipped step: nothing changes
  cpu::adamw_step(param, grad, m, v, grad_norm_sq, max_norm, cfg, step, stream, schedule);
  cpu::fp8_quantize_blocks(out, out_t, param, stream);
}

}  // namespace moe::cpu

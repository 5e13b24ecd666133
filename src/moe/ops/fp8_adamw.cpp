#include "moe/ops/fp8_adamw.h"

#include "moe/ops/cpu/fp8_adamw.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/fp8_checks.h"
#include "moe/ops/op_checks.h"
#include "moe/ops/optim_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/fp8_adamw.h")
#include "moe/ops/cuda/fp8_adamw.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void adamw_step_quantize_blocks(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                                const AdamWConfig& cfg, int64_t step, Fp8Tensor out, Fp8Tensor out_t, Stream stream,
                                Tensor schedule) {
  const OpCheck check("adamw_step_quantize_blocks", param.device);
  check_adamw_step(check, param, grad, m, v, grad_norm_sq, step, schedule);
  check_block_caches(check, out, out_t, param, "param");
  MOE_OP_DISPATCH(param.device, adamw_step_quantize_blocks, param, grad, m, v, grad_norm_sq, max_norm, cfg, step,
                  out, out_t, stream, schedule);
}

}  // namespace moe

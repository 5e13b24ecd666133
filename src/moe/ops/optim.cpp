#include "moe/ops/optim.h"

#include "moe/ops/cpu/optim.h"
#include "moe/ops/dispatch.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/optim.h")
#include "moe/ops/cuda/optim.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void sum_squares_accumulate(Tensor out, Tensor x, Stream stream) {
  MOE_OP_DISPATCH(x.device, sum_squares_accumulate, out, x, stream);
}

void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                const AdamWConfig& cfg, int64_t step, Stream stream, Tensor schedule, Tensor param_bf16) {
  MOE_OP_DISPATCH(param.device, adamw_step, param, grad, m, v, grad_norm_sq, max_norm, cfg, step, stream, schedule,
                  param_bf16);
}

}  // namespace moe

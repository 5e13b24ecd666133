#include "moe/ops/norm.h"

#include "moe/ops/cpu/norm.h"
#include "moe/ops/dispatch.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/norm.h")
#include "moe/ops/cuda/norm.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, Stream stream) {
  MOE_OP_DISPATCH(x.device, rmsnorm_forward, out, rstd, x, weight, eps, stream);
}

void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd,
                      bool accumulate_dx, Stream stream) {
  MOE_OP_DISPATCH(x.device, rmsnorm_backward, dx, dweight, dout, x, weight, rstd, accumulate_dx, stream);
}

}  // namespace moe

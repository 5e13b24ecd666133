#include "moe/ops/gemm.h"

#include "moe/ops/cpu/gemm.h"
#include "moe/ops/dispatch.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/gemm.h")
#include "moe/ops/cuda/gemm.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void matmul(Tensor c, Tensor a, Tensor b, bool trans_a, bool trans_b, float alpha, float beta, Stream stream) {
  MOE_OP_DISPATCH(c.device, matmul, c, a, b, trans_a, trans_b, alpha, beta, stream);
}

}  // namespace moe

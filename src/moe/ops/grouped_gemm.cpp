#include "moe/ops/grouped_gemm.h"

#include "moe/ops/cpu/grouped_gemm.h"
#include "moe/ops/dispatch.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/grouped_gemm.h")
#include "moe/ops/cuda/grouped_gemm.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void grouped_matmul(Tensor c, Tensor a, Tensor b, Tensor expert_offsets, bool trans_b, bool accumulate, Stream stream) {
  MOE_OP_DISPATCH(c.device, grouped_matmul, c, a, b, expert_offsets, trans_b, accumulate, stream);
}

void grouped_matmul_wgrad(Tensor db, Tensor dc, Tensor a, Tensor expert_offsets, Stream stream, bool accumulate) {
  MOE_OP_DISPATCH(db.device, grouped_matmul_wgrad, db, dc, a, expert_offsets, stream, accumulate);
}

}  // namespace moe

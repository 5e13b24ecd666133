#include "moe/ops/rope.h"

#include "moe/ops/cpu/rope.h"
#include "moe/ops/dispatch.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/rope.h")
#include "moe/ops/cuda/rope.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void rope_forward(Tensor x, int64_t seq_len, int64_t n_heads, float theta, Stream stream) {
  MOE_OP_DISPATCH(x.device, rope_forward, x, seq_len, n_heads, theta, stream);
}

void rope_backward(Tensor dx, int64_t seq_len, int64_t n_heads, float theta, Stream stream) {
  MOE_OP_DISPATCH(dx.device, rope_backward, dx, seq_len, n_heads, theta, stream);
}

}  // namespace moe

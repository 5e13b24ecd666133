#include "moe/ops/attention.h"

#include "moe/ops/cpu/attention.h"
#include "moe/ops/dispatch.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/attention.h")
#include "moe/ops/cuda/attention.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

// NOTES: the workspace size has no tensor to dispatch on; it is the CPU size. The CUDA op (cuDNN)
// ignores the caller's workspace and keeps its own per-stream buffer (moe/ops/cuda/attention.h),
// so no device argument is needed here.
int64_t attention_workspace_elems(const AttentionShape& s) { return cpu::attention_workspace_elems(s); }

void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttentionShape& s,
                       Tensor workspace, Stream stream) {
  MOE_OP_DISPATCH(q.device, attention_forward, out, lse, q, k, v, s, workspace, stream);
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                        Tensor lse, const AttentionShape& s, Tensor workspace, Stream stream) {
  MOE_OP_DISPATCH(q.device, attention_backward, dq, dk, dv, dout, q, k, v, out, lse, s, workspace, stream);
}

}  // namespace moe

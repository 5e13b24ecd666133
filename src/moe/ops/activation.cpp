#include "moe/ops/activation.h"

#include "moe/ops/cpu/activation.h"
#include "moe/ops/dispatch.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/activation.h")
#include "moe/ops/cuda/activation.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void swiglu_forward(Tensor out, Tensor gate_up, Stream stream) {
  MOE_OP_DISPATCH(gate_up.device, swiglu_forward, out, gate_up, stream);
}

void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, Stream stream) {
  MOE_OP_DISPATCH(gate_up.device, swiglu_backward, dgate_up, dout, gate_up, stream);
}

}  // namespace moe

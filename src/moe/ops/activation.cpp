#include "moe/ops/activation.h"

#include "moe/ops/cpu/activation.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/activation.h")
#include "moe/ops/cuda/activation.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

namespace {

// gate_up [R, 2H] for out (or dout) [R, H], every tensor of the call's dtype T.
void check_swiglu(const OpCheck& check, const char* rows_name, const Tensor& rows, const Tensor& gate_up) {
  check.compute_dtype("gate_up", gate_up);
  check.same_dtype(rows_name, rows, "gate_up", gate_up);
  check.ndim("gate_up", gate_up, 2);
  check.ndim(rows_name, rows, 2);
  MOE_CHECK(gate_up.dim(0) == rows.dim(0) && gate_up.dim(1) == 2 * rows.dim(1), check.op(), ": gate_up ",
            gate_up.shape.str(), " must be [R, 2H] for ", rows_name, " ", rows.shape.str());
}

}  // namespace

void swiglu_forward(Tensor out, Tensor gate_up, Stream stream) {
  check_swiglu(OpCheck("swiglu_forward", gate_up.device), "out", out, gate_up);
  MOE_OP_DISPATCH(gate_up.device, swiglu_forward, out, gate_up, stream);
}

void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, Stream stream) {
  const OpCheck check("swiglu_backward", gate_up.device);
  check_swiglu(check, "dout", dout, gate_up);
  check.same_dtype("dgate_up", dgate_up, "gate_up", gate_up);
  check.same_shape("dgate_up", dgate_up, "gate_up", gate_up);
  MOE_OP_DISPATCH(gate_up.device, swiglu_backward, dgate_up, dout, gate_up, stream);
}

void swiglu_backward_with_output(Tensor dgate_up, Tensor out, Tensor dout, Tensor gate_up, Stream stream) {
  const OpCheck check("swiglu_backward_with_output", gate_up.device);
  check_swiglu(check, "dout", dout, gate_up);
  check_swiglu(check, "out", out, gate_up);
  check.same_dtype("dgate_up", dgate_up, "gate_up", gate_up);
  check.same_shape("dgate_up", dgate_up, "gate_up", gate_up);
  MOE_OP_DISPATCH(gate_up.device, swiglu_backward_with_output, dgate_up, out, dout, gate_up, stream);
}

}  // namespace moe

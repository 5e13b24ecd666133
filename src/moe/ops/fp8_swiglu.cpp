#include "moe/ops/fp8_swiglu.h"

#include "moe/ops/cpu/fp8_swiglu.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/fp8_checks.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/fp8_swiglu.h")
#include "moe/ops/cuda/fp8_swiglu.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

namespace {

// gate_up [R, 2H] for `name` [R, H], both F32 or BF16 of one dtype.
void check_gate_up(const OpCheck& check, const char* name, const Tensor& t, const Tensor& gate_up) {
  check_f32_or_bf16(check, "gate_up", gate_up);
  check.on_device(name, t);
  check.ndim("gate_up", gate_up, 2);
  check.ndim(name, t, 2);
  check.same_dtype(name, t, "gate_up", gate_up);
  MOE_CHECK(gate_up.dim(0) == t.dim(0) && gate_up.dim(1) == 2 * t.dim(1), check.op(), ": gate_up ",
            gate_up.shape.str(), " must be [R, 2H] for ", name, " ", t.shape.str());
}

}  // namespace

void fp8_swiglu_forward(Tensor out, Fp8Tensor out_rows, Tensor gate_up, Stream stream) {
  const OpCheck check("fp8_swiglu_forward", gate_up.device);
  check_gate_up(check, "out", out, gate_up);
  check_fp8(check, "out_rows", out_rows, Fp8Tiles::Rows, 2, 2);
  check.same_shape("out_rows.codes", out_rows.codes, "out", out);
  MOE_OP_DISPATCH(gate_up.device, fp8_swiglu_forward, out, out_rows, gate_up, stream);
}

void fp8_swiglu_forward_rows_and_columns(Fp8Tensor out_rows, Fp8Tensor out_columns, Tensor gate_up, Tensor offsets,
                                         Stream stream) {
  const OpCheck check("fp8_swiglu_forward_rows_and_columns", gate_up.device);
  check_f32_or_bf16(check, "gate_up", gate_up);
  check.ndim("gate_up", gate_up, 2);
  MOE_CHECK(gate_up.dim(1) % 2 == 0, check.op(), ": gate_up ", gate_up.shape.str(), " must be [R, 2H]");
  const int64_t R = gate_up.dim(0), H = gate_up.dim(1) / 2;
  check_fp8(check, "out_rows", out_rows, Fp8Tiles::Rows, 2, 2);
  check.shape("out_rows.codes", out_rows.codes, Shape{R, H});
  check_columns_layout(check, "out_columns", out_columns, R, H, offsets);
  MOE_OP_DISPATCH(gate_up.device, fp8_swiglu_forward_rows_and_columns, out_rows, out_columns, gate_up, offsets,
                  stream);
}

void fp8_swiglu_backward(Fp8Tensor rows, Fp8Tensor columns, Tensor dout, Tensor gate_up, Tensor offsets,
                         Stream stream) {
  const OpCheck check("fp8_swiglu_backward", gate_up.device);
  check_gate_up(check, "dout", dout, gate_up);
  check_fp8(check, "rows", rows, Fp8Tiles::Rows, 2, 2);
  check.same_shape("rows.codes", rows.codes, "gate_up", gate_up);
  check_columns_layout(check, "columns", columns, gate_up.dim(0), gate_up.dim(1), offsets);
  MOE_OP_DISPATCH(gate_up.device, fp8_swiglu_backward, rows, columns, dout, gate_up, offsets, stream);
}

}  // namespace moe

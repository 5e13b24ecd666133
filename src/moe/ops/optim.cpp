#include "moe/ops/optim.h"

#include <cmath>

#include "moe/core/device.h"
#include "moe/ops/cpu/optim.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/op_checks.h"
#include "moe/ops/optim_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/optim.h")
#include "moe/ops/cuda/optim.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

int64_t sum_squares_workspace_elems(Device device, int64_t n) {
  MOE_CHECK(n >= 0, "sum_squares_workspace_elems: n = ", n, " is negative");
  MOE_OP_DISPATCH(device, sum_squares_workspace_elems, n);
}

void sum_squares_accumulate(Tensor out, Tensor x, Tensor workspace, Stream stream) {
  const OpCheck check("sum_squares_accumulate", x.device);
  check.tensor("out", out, DType::F32);
  check.tensor("x", x, DType::F32);
  check.numel("out", out, 1);
  check.workspace("workspace", workspace, sum_squares_workspace_elems(x.device, x.numel()),
                  "sum_squares_workspace_elems");
  MOE_OP_DISPATCH(x.device, sum_squares_accumulate, out, x, workspace, stream);
}

void check_adamw_step(const OpCheck& check, const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                      const Tensor& grad_norm_sq, int64_t step, const Tensor& schedule) {
  const char* op = check.op();
  check.tensor("param", param, DType::F32);
  check.tensor("grad", grad, DType::F32);
  // Moments: F32, or BF16 storage (optim.moment_dtype); one dtype for both.
  check.tensor("m", m, m.dtype == DType::BF16 ? DType::BF16 : DType::F32, "moments are F32 or BF16");
  check.same_dtype("v", v, "m", m);
  check.tensor("grad_norm_sq", grad_norm_sq, DType::F32);
  check.same_shape("grad", grad, "param", param);
  check.same_shape("m", m, "param", param);
  check.same_shape("v", v, "param", param);
  check.numel("grad_norm_sq", grad_norm_sq, 1);
  if (schedule.empty()) {
    MOE_CHECK(step >= 1, op, ": step = ", step, " must count from 1");
  } else {
    check.tensor("schedule", schedule, DType::F32);
    check.numel("schedule", schedule, 2, "lr, step");
    // On the GPU the step is read inside the kernel, unchecked (see ops/cuda/optim.h).
    if (check.host_data()) {
      const double step_count = schedule.f32()[1];
      MOE_CHECK(std::isfinite(step_count) && step_count >= 1 && step_count == std::floor(step_count), op,
                ": schedule[1] = ", step_count, " is not a step counting from 1");
    }
  }
}

void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                const AdamWConfig& cfg, int64_t step, Stream stream, Tensor schedule, Tensor param_bf16) {
  const OpCheck check("adamw_step", param.device);
  check_adamw_step(check, param, grad, m, v, grad_norm_sq, step, schedule);
  if (!param_bf16.empty()) {
    check.tensor("param_bf16", param_bf16, DType::BF16, "the BF16 copy of param");
    check.numel("param_bf16", param_bf16, param.numel(), "one per element of param");
  }
  MOE_OP_DISPATCH(param.device, adamw_step, param, grad, m, v, grad_norm_sq, max_norm, cfg, step, stream, schedule,
                  param_bf16);
}

AdamWOutcome read_adamw_outcome(const Tensor& grad_norm_sq) {
  const OpCheck check("read_adamw_outcome", grad_norm_sq.device);
  check.tensor("grad_norm_sq", grad_norm_sq, DType::F32);
  check.numel("grad_norm_sq", grad_norm_sq, 1);
  float sq = 0;
  copy_from_tensor(&sq, grad_norm_sq);
  return {std::sqrt(static_cast<double>(sq)), !std::isfinite(sq)};
}

}  // namespace moe

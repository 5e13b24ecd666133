#include "moe/ops/norm.h"

#include "moe/ops/cpu/norm.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/norm_checks.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/norm.h")
#include "moe/ops/cuda/norm.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void check_rmsnorm_rows(const OpCheck& check, const Tensor& x, const Tensor& weight, const Tensor& rstd) {
  check.compute_dtype("x", x);
  check.same_dtype("weight", weight, "x", x);
  check.tensor("rstd", rstd, DType::F32);
  check.ndim("weight", weight, 1);
  const int64_t C = weight.dim(0);
  MOE_CHECK(x.ndim() >= 1 && x.dim(-1) == C, check.op(), ": x ", x.shape.str(), " must end in C = ", C,
            " (the weight length)");
  check.numel("rstd", rstd, C == 0 ? 0 : x.numel() / C, "one per row of x");
}

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, Stream stream) {
  const OpCheck check("rmsnorm_forward", x.device);
  check_rmsnorm_rows(check, x, weight, rstd);
  check.same_dtype("out", out, "x", x);
  check.same_shape("out", out, "x", x);
  MOE_OP_DISPATCH(x.device, rmsnorm_forward, out, rstd, x, weight, eps, stream);
}

void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd,
                      bool accumulate_dx, Stream stream) {
  const OpCheck check("rmsnorm_backward", x.device);
  check_rmsnorm_rows(check, x, weight, rstd);
  check.same_dtype("dout", dout, "x", x);
  check.same_dtype("dx", dx, "x", x);
  check.tensor("dweight", dweight, DType::F32, "an FP32 gradient accumulator");
  check.same_shape("dx", dx, "x", x);
  check.same_shape("dout", dout, "x", x);
  check.same_shape("dweight", dweight, "weight", weight);
  MOE_OP_DISPATCH(x.device, rmsnorm_backward, dx, dweight, dout, x, weight, rstd, accumulate_dx, stream);
}

}  // namespace moe

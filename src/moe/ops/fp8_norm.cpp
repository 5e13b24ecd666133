#include "moe/ops/fp8_norm.h"

#include "moe/ops/cpu/fp8_norm.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/fp8_checks.h"
#include "moe/ops/norm_checks.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/fp8_norm.h")
#include "moe/ops/cuda/fp8_norm.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void fp8_rmsnorm_forward(Tensor out, Tensor rstd, Fp8Tensor out_rows, Tensor x, Tensor weight, float eps,
                         Stream stream) {
  const OpCheck check("fp8_rmsnorm_forward", x.device);
  check_rmsnorm_rows(check, x, weight, rstd);
  check.same_dtype("out", out, "x", x);
  check.same_shape("out", out, "x", x);
  check_fp8(check, "out_rows", out_rows, Fp8Tiles::Rows, 2, 2);
  const int64_t C = weight.dim(0), R = C == 0 ? 0 : x.numel() / C;
  check.shape("out_rows.codes", out_rows.codes, Shape{R, C});
  MOE_OP_DISPATCH(x.device, fp8_rmsnorm_forward, out, rstd, out_rows, x, weight, eps, stream);
}

}  // namespace moe

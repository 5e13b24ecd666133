#include "moe/ops/loss.h"

#include "moe/ops/cpu/loss.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/loss.h")
#include "moe/ops/cuda/loss.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void lm_head_cross_entropy(Tensor loss_sum, Tensor dh, Tensor dweight, Tensor h, Tensor weight, Tensor targets,
                           float grad_scale, Tensor workspace, Stream stream) {
  const OpCheck check("lm_head_cross_entropy", h.device);
  const char* op = check.op();
  const DType T = check.compute_dtype("h", h);
  check.same_dtype("weight", weight, "h", h);
  check.tensor("loss_sum", loss_sum, DType::F32);
  check.tensor("workspace", workspace, DType::F32);
  check.tensor("targets", targets, DType::I32);
  MOE_CHECK(h.ndim() == 2, op, ": h must be 2-D [R, D], got ", h.shape.str());
  MOE_CHECK(weight.ndim() == 2 && weight.dim(1) == h.dim(1), op, ": weight ", weight.shape.str(),
            " must be [V, D] with D = ", h.dim(1));
  const int64_t R = h.dim(0), V = weight.dim(0);
  check.numel("targets", targets, R, "one per row of h");
  check.numel("loss_sum", loss_sum, 1);
  MOE_CHECK(workspace.ndim() == 2 && workspace.dim(1) == V && workspace.dim(0) > 0, op, ": workspace ",
            workspace.shape.str(), " must be [chunk, V] with V = ", V, " and chunk > 0");
  if (!dh.empty()) {
    check.output_dtype("dh", dh, T);
    check.same_shape("dh", dh, "h", h);
  }
  if (!dweight.empty()) {
    check.output_dtype("dweight", dweight, T);
    check.same_shape("dweight", dweight, "weight", weight);
  }
  MOE_CHECK(V > 0 || R == 0, op, ": vocabulary size is 0");
  if (check.host_data()) check.values_in("targets", targets, -1, V, "-1 ignores the row");
  MOE_OP_DISPATCH(h.device, lm_head_cross_entropy, loss_sum, dh, dweight, h, weight, targets, grad_scale,
                  workspace, stream);
}

}  // namespace moe

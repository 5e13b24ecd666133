#include "moe/ops/fp8_gather.h"

#include "moe/ops/cpu/fp8_gather.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/fp8_checks.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/fp8_gather.h")
#include "moe/ops/cuda/fp8_gather.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

namespace {

// src's tensors, and the columns operand of its M = route_of_row rows of D features.
void check_gathered(const OpCheck& check, const Fp8Tensor& columns, const GatheredRows& src, const Tensor& offsets) {
  check_f32_or_bf16(check, "x", src.x);
  check.ndim("x", src.x, 2);
  check.tensor("route_of_row", src.route_of_row, DType::I32, 1);
  MOE_CHECK(src.top_k >= 1, check.op(), ": top_k = ", src.top_k, " must be at least 1");
  if (!src.weights.empty()) {
    check.tensor("weights", src.weights, DType::F32, 2);
    check.shape("weights", src.weights, Shape{src.x.dim(0), src.top_k});
  }
  if (check.host_data())
    check.values_in("route_of_row", src.route_of_row, -1, src.x.dim(0) * src.top_k,
                    "-1 for a row no route fills, else a route t * top_k + k");
  check_columns_layout(check, "columns", columns, src.route_of_row.dim(0), src.x.dim(1), offsets);
}

}  // namespace

void fp8_quantize_gathered_columns(Fp8Tensor columns, const GatheredRows& src, Tensor offsets, Stream stream) {
  const OpCheck check("fp8_quantize_gathered_columns", src.x.device);
  check_gathered(check, columns, src, offsets);
  MOE_OP_DISPATCH(src.x.device, fp8_quantize_gathered_columns, columns, src, offsets, stream);
}

void fp8_quantize_gathered_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, const GatheredRows& src,
                                            Tensor offsets, Stream stream) {
  const OpCheck check("fp8_quantize_gathered_rows_and_columns", src.x.device);
  check_gathered(check, columns, src, offsets);
  check_fp8(check, "rows", rows, Fp8Tiles::Rows, 2, 2);
  check.shape("rows.codes", rows.codes, Shape{src.route_of_row.dim(0), src.x.dim(1)});
  MOE_OP_DISPATCH(src.x.device, fp8_quantize_gathered_rows_and_columns, rows, columns, src, offsets, stream);
}

}  // namespace moe

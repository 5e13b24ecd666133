#include "moe/ops/fp8_requantize.h"

#include "moe/ops/cpu/fp8_requantize.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/fp8_checks.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/fp8_requantize.h")
#include "moe/ops/cuda/fp8_requantize.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void fp8_requantize_columns(Fp8Tensor out, Fp8Tensor x, DType values, Tensor offsets, Stream stream) {
  const OpCheck check("fp8_requantize_columns", x.codes.device);
  check_fp8(check, "x", x, Fp8Tiles::Rows, 2, 2);
  MOE_CHECK(values == DType::F32 || values == DType::BF16, check.op(), ": values must be F32 or BF16, got ",
            dtype_name(values));
  check_columns_layout(check, "out", out, x.codes.dim(0), x.codes.dim(1), offsets);
  MOE_OP_DISPATCH(x.codes.device, fp8_requantize_columns, out, x, values, offsets, stream);
}

}  // namespace moe

// Argument checks shared by the RMSNorm ops (moe/ops/norm.h, moe/ops/fp8_norm.h).
#pragma once

#include "moe/core/tensor.h"
#include "moe/ops/op_checks.h"

namespace moe {

// x [R, C] (any leading dims) and weight [C] of the call's dtype (F32 or BF16), rstd F32 with one
// element per row.
void check_rmsnorm_rows(const OpCheck& check, const Tensor& x, const Tensor& weight, const Tensor& rstd);

}  // namespace moe

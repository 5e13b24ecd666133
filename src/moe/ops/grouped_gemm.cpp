#include "moe/ops/grouped_gemm.h"

#include "moe/ops/cpu/grouped_gemm.h"
#include "moe/ops/dispatch.h"

namespace moe {

void grouped_matmul(Tensor c, Tensor a, Tensor b, Tensor expert_offsets, bool trans_b, bool accumulate, Stream stream) {
  MOE_OP_DISPATCH(c.device, grouped_matmul, c, a, b, expert_offsets, trans_b, accumulate, stream);
}

void grouped_matmul_wgrad(Tensor db, Tensor dc, Tensor a, Tensor expert_offsets, Stream stream) {
  MOE_OP_DISPATCH(db.device, grouped_matmul_wgrad, db, dc, a, expert_offsets, stream);
}

}  // namespace moe

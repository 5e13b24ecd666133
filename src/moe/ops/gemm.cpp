#include "moe/ops/gemm.h"

#include "moe/ops/cpu/gemm.h"
#include "moe/ops/dispatch.h"

namespace moe {

void matmul(Tensor c, Tensor a, Tensor b, bool trans_a, bool trans_b, float alpha, float beta, Stream stream) {
  MOE_OP_DISPATCH(c.device, matmul, c, a, b, trans_a, trans_b, alpha, beta, stream);
}

}  // namespace moe

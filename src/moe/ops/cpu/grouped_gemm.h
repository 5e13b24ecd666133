// CPU grouped expert GEMMs: one OpenBLAS sgemm per expert (the reference meaning of ops/grouped_gemm.h).
#pragma once

#include "moe/ops/grouped_gemm.h"

namespace moe::cpu {

void grouped_matmul(Tensor c, Tensor a, Tensor b, Tensor expert_offsets, bool trans_b, bool accumulate,
                    Stream stream = {});
void grouped_matmul_wgrad(Tensor db, Tensor dc, Tensor a, Tensor expert_offsets, Stream stream = {},
                          bool accumulate = true);

}  // namespace moe::cpu

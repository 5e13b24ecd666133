// Expert matrix products over an expert-major row buffer, one product per expert, with the
// per-expert row ranges read from expert_offsets (device memory on GPUs: no host copy).
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

// For each expert e with rows [o_e, o_{e+1}) = [expert_offsets[e], expert_offsets[e+1]):
//   c[o_e:o_{e+1}] (= or +=, per accumulate) a[o_e:o_{e+1}] * (trans_b ? b[e]^T : b[e]).
// a [rows, K_in]; b [E, N_out, K_in] when trans_b, else [E, K_in, N_out]; c [rows, N_out];
// expert_offsets [E+1] i32. Rows past expert_offsets[E] are not touched. Experts with zero rows are skipped.
void grouped_matmul(Tensor c, Tensor a, Tensor b, Tensor expert_offsets, bool trans_b, bool accumulate,
                    Stream stream = {});

// Weight gradient: db[e] (+= when accumulate, else =) dc[o_e:o_{e+1}]^T * a[o_e:o_{e+1}]
// (db [E, N_out, K_in]). With accumulate = false an expert with no rows gets db[e] = 0: the first
// microbatch after the gradients were zeroed writes them without reading them back (an F32
// read of every expert's gradient saved per layer).
void grouped_matmul_wgrad(Tensor db, Tensor dc, Tensor a, Tensor expert_offsets, Stream stream = {},
                          bool accumulate = true);

}  // namespace moe

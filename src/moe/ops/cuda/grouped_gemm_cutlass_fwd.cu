// Forward expert products (trans_b = true): c = a * b[e]^T, A row-major x B column-major -> BF16.
// One CUTLASS instantiation in its own translation unit (see grouped_gemm_cutlass.h).
#if defined(MOE_HAVE_CUTLASS)
#include "moe/ops/cuda/grouped_gemm_cutlass.cuh"

namespace moe::cuda::cutlass_grouped {
namespace {
using GemmNt = ExpertGemm<ExpertProduct::kForward>;
}  // namespace

void matmul_nt_bf16(void* c, const void* a, const void* b, const int32_t* offsets, int groups, int64_t rows,
                    int n_out, int k_in, bool accumulate, const Scratch& scratch, cudaStream_t stream) {
  run_grouped<GemmNt, ExpertProduct::kForward>(c, a, b, offsets, groups, rows, n_out, k_in, accumulate ? 1.0f : 0.0f, scratch,
                                      stream, "grouped_matmul (CUTLASS, trans_b)");
}

void prepare_nt_bf16() { prepare_kernel<GemmNt>(); }

}  // namespace moe::cuda::cutlass_grouped
#endif

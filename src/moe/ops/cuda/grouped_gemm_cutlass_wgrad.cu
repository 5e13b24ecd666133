// Expert weight gradients: db[e] += dc_e^T a_e, A = dc read column-major x B = a row-major -> F32,
// beta = 1 (gradient accumulation). One CUTLASS instantiation in its own translation unit (see
// grouped_gemm_cutlass.h).
#if defined(MOE_HAVE_CUTLASS)
#include "moe/ops/cuda/grouped_gemm_cutlass.cuh"

namespace moe::cuda::cutlass_grouped {
namespace {
using GemmWgrad = GroupedGemm<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float>;
}  // namespace

void wgrad_bf16_f32(void* db, const void* dc, const void* a, const int32_t* offsets, int groups, int64_t rows,
                    int n_out, int k_in, const Scratch& scratch, cudaStream_t stream) {
  run_grouped<GemmWgrad, Product::kWgrad>(db, dc, a, offsets, groups, rows, n_out, k_in, 1.0f, scratch, stream,
                                          "grouped_matmul_wgrad (CUTLASS)");
}

void prepare_wgrad_bf16_f32() { prepare_kernel<GemmWgrad>(); }

}  // namespace moe::cuda::cutlass_grouped
#endif

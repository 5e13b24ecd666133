// Expert weight gradients: db[e] += dc_e^T a_e, A = dc read column-major x B = a row-major -> F32,
// beta = 1 (gradient accumulation). One CUTLASS instantiation in its own translation unit (see
// grouped_gemm_cutlass.h).
#if defined(MOE_HAVE_CUTLASS)
#include "moe/ops/cuda/grouped_gemm_cutlass.cuh"

#include <algorithm>

namespace moe::cuda::cutlass_grouped {
namespace {
using GemmWgrad = ExpertGemm<ExpertProduct::kWeightGrad>;
}  // namespace

// With accumulate = false, beta = 0 (db is written, never read) and the experts with no rows,
// which the grouped GEMM skips, are zeroed by a small kernel that reads the offsets on the device.
__global__ void zero_empty_experts(float* db, const int32_t* __restrict__ offsets, int64_t rows, int64_t per_expert) {
  const int e = static_cast<int>(blockIdx.y);
  const int64_t lo = min(max(static_cast<int64_t>(offsets[e]), int64_t{0}), rows);
  const int64_t hi = min(max(static_cast<int64_t>(offsets[e + 1]), int64_t{0}), rows);
  if (hi > lo) return;
  float* d = db + static_cast<int64_t>(e) * per_expert;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < per_expert; i += stride) d[i] = 0.0f;
}

void wgrad_bf16_f32(void* db, const void* dc, const void* a, const int32_t* offsets, int groups, int64_t rows,
                    int n_out, int k_in, bool accumulate, const Scratch& scratch, cudaStream_t stream) {
  if (!accumulate) {
    const int64_t per_expert = static_cast<int64_t>(n_out) * k_in;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>((per_expert + 255) / 256, 64)), static_cast<unsigned>(groups));
    zero_empty_experts<<<grid, 256, 0, stream>>>(static_cast<float*>(db), offsets, rows, per_expert);
    CUDA_CHECK_LAUNCH();
  }
  run_grouped<GemmWgrad, ExpertProduct::kWeightGrad>(db, dc, a, offsets, groups, rows, n_out, k_in, accumulate ? 1.0f : 0.0f,
                                          scratch, stream, "grouped_matmul_wgrad (CUTLASS)");
}

void prepare_wgrad_bf16_f32() { prepare_kernel<GemmWgrad>(); }

}  // namespace moe::cuda::cutlass_grouped
#endif

// FP8 expert products c = a * b[e]^T -> BF16: the forward (b = the weights' Blocks cache) and the
// data gradient (b = their transposed cache), the same kernel. One CUTLASS instantiation in its own
// translation unit (see fp8_grouped_gemm_cutlass.h).
#if defined(MOE_HAVE_CUTLASS)
#include "moe/ops/cuda/fp8_grouped_gemm_cutlass.cuh"

namespace moe::cuda::cutlass_grouped {
namespace {

// C void: beta is always 0 here, and without C's stages the mainloop gets a sixth (NOTES in
// fp8_grouped_gemm_cutlass.cuh).
using GemmNt = Fp8GroupedGemm<kFp8ScaleBlock, cutlass::bfloat16_t, void>;

// One thread per expert: shapes, pointers and strides of group e from the offsets.
// a [rows, k_in] Rows tiles, b [E, n_out, k_in] Blocks tiles, c [rows, n_out].
__global__ void build_nt_groups(Fp8GroupArrays<GemmNt> arr, const int32_t* __restrict__ offsets, int groups,
                                int64_t rows, int n_out, int k_in, const uint8_t* a_codes, const float* a_scales,
                                const uint8_t* b_codes, const float* b_scales, cutlass::bfloat16_t* c,
                                GemmNt::StrideA stride_a, GemmNt::StrideB stride_b, GemmNt::StrideC stride_c) {
  const int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (e >= groups) return;
  // Clamped into [0, rows] as in the BF16 products: bad offsets give wrong ranges, never stray rows.
  const int64_t lo = min(max(static_cast<int64_t>(offsets[e]), int64_t{0}), rows);
  const int64_t hi = min(max(static_cast<int64_t>(offsets[e + 1]), int64_t{0}), rows);
  const int m = hi > lo ? static_cast<int>(hi - lo) : 0;
  const int k_blocks = (k_in + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  const int n_blocks = (n_out + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
  arr.shapes[e] = GroupShape(m, n_out, k_in);  // m = 0: no tiles, the group is skipped
  arr.ptr_a[e] = reinterpret_cast<const cutlass::float_e4m3_t*>(a_codes + lo * k_in);
  arr.ptr_b[e] = reinterpret_cast<const cutlass::float_e4m3_t*>(b_codes + static_cast<int64_t>(e) * n_out * k_in);
  arr.ptr_c[e] = nullptr;  // no C
  arr.ptr_d[e] = c + lo * n_out;
  arr.ptr_sfa[e] = a_scales + lo * k_blocks;
  arr.ptr_sfb[e] = b_scales + static_cast<int64_t>(e) * n_blocks * k_blocks;
  arr.stride_a[e] = stride_a;
  arr.stride_b[e] = stride_b;
  arr.stride_c[e] = stride_c;
  arr.stride_d[e] = stride_c;
}

}  // namespace

void fp8_matmul_nt_bf16(void* c, Fp8Operand a, Fp8Operand b, const int32_t* offsets, int groups, int64_t rows,
                        int n_out, int k_in, const Scratch& scratch, cudaStream_t stream) {
  const char* op = "fp8_grouped_matmul (CUTLASS)";
  MOE_CHECK(groups >= 1 && groups <= kMaxGroups, op, ": ", groups, " groups, expected 1..", kMaxGroups);
  const Fp8GroupArrays<GemmNt> arr = carve_fp8_arrays<GemmNt>(scratch);
  // Packed row-major strides; they do not depend on a group's row count (L = 1).
  const auto stride_a = cutlass::make_cute_packed_stride(GemmNt::StrideA{}, {1, k_in, 1});
  const auto stride_b = cutlass::make_cute_packed_stride(GemmNt::StrideB{}, {n_out, k_in, 1});
  const auto stride_c = cutlass::make_cute_packed_stride(GemmNt::StrideC{}, {1, n_out, 1});
  constexpr int kSetupThreads = 128;
  build_nt_groups<<<(groups + kSetupThreads - 1) / kSetupThreads, kSetupThreads, 0, stream>>>(
      arr, offsets, groups, rows, n_out, k_in, static_cast<const uint8_t*>(a.codes), a.scales,
      static_cast<const uint8_t*>(b.codes), b.scales, static_cast<cutlass::bfloat16_t*>(c), stride_a, stride_b,
      stride_c);
  CUDA_CHECK_LAUNCH();
  run_fp8_grouped<GemmNt>(arr, groups, 0.0f, scratch, stream, op);
}

void prepare_fp8_nt_bf16() { prepare_kernel<GemmNt>(); }

}  // namespace moe::cuda::cutlass_grouped
#endif

// FP8 expert weight gradients db[e] (+)= dc_e^T x_e from the Columns operands (moe/ops/fp8.h):
// A = dc_t [n_out, columns] and B = x_t [k_in, columns], both read over expert e's column segment,
// -> F32. One CUTLASS instantiation in its own translation unit (see fp8_grouped_gemm_cutlass.h).
#if defined(MOE_HAVE_CUTLASS)
#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "moe/ops/cuda/fp8_grouped_gemm_cutlass.cuh"

namespace moe::cuda::cutlass_grouped {
namespace {

// Columns operands: MN-major scales (5.8% / 3.3% faster gate_up / down weight gradients on an H100
// than the K-major ones before, bench/RESULTS.md, thirty-second session).
using GemmWgrad = Fp8GroupedGemm<1, float, float, cute::GMMA::Major::MN>;

// One block of kMaxGroups threads, thread g for expert g: its segment starts at p_g, the exclusive
// prefix sum of round_up(M_g', 128) (a block scan), and spans K_g = round_up(M_g, 128) columns.
// An expert without rows, or whose segment would pass `columns`, gets M = 0 (no tiles).
__global__ void __launch_bounds__(kMaxGroups)
    build_wgrad_groups(Fp8GroupArrays<GemmWgrad> arr, const int32_t* __restrict__ offsets, int groups,
                       int64_t columns, int n_out, int k_in, const uint8_t* dc_codes, const float* dc_scales,
                       const uint8_t* x_codes, const float* x_scales, float* db, GemmWgrad::StrideA stride_a,
                       GemmWgrad::StrideB stride_b, GemmWgrad::StrideC stride_c) {
  using Scan = cub::BlockScan<int64_t, kMaxGroups>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int g = static_cast<int>(threadIdx.x);
  int64_t rows = 0;
  if (g < groups) rows = max(static_cast<int64_t>(offsets[g + 1]) - static_cast<int64_t>(offsets[g]), int64_t{0});
  const int64_t span = (rows + kFp8ScaleBlock - 1) / kFp8ScaleBlock * kFp8ScaleBlock;
  int64_t start = 0;
  Scan(scan_storage).ExclusiveSum(span, start);
  if (g >= groups) return;
  const bool runs = rows > 0 && start + span <= columns;
  const int k = runs ? static_cast<int>(span) : 0;
  const int64_t first = runs ? start : 0;  // a skipped group's pointers stay inside the operands
  // NOTES: a skipped expert gets M = 0 rather than only K = 0, as in the BF16 weight gradient: with
  // K = 0 the epilogue would still rewrite db[e] as 1 * db[e] + 0, which turns -0 into +0.
  arr.shapes[g] = GroupShape(runs ? n_out : 0, k_in, k);
  arr.ptr_a[g] = reinterpret_cast<const cutlass::float_e4m3_t*>(dc_codes + first);
  arr.ptr_b[g] = reinterpret_cast<const cutlass::float_e4m3_t*>(x_codes + first);
  arr.ptr_c[g] = db + static_cast<int64_t>(g) * n_out * k_in;
  arr.ptr_d[g] = db + static_cast<int64_t>(g) * n_out * k_in;
  // The segment's scales (tile-major): from token tile first / 128 on, one row of n_out (k_in) per tile.
  const int64_t first_tile = first / kFp8ScaleBlock;
  arr.ptr_sfa[g] = dc_scales + first_tile * n_out;
  arr.ptr_sfb[g] = x_scales + first_tile * k_in;
  arr.stride_a[g] = stride_a;
  arr.stride_b[g] = stride_b;
  arr.stride_c[g] = stride_c;
  arr.stride_d[g] = stride_c;
}

// With accumulate = false, beta = 0 (db is written, never read) and the experts the grouped GEMM
// skips (M = 0 in the setup kernel's shapes) are zeroed here.
__global__ void zero_skipped_experts(float* db, const GroupShape* __restrict__ shapes, int64_t per_expert) {
  const int e = static_cast<int>(blockIdx.y);
  if (cute::get<0>(shapes[e]) != 0) return;
  float* d = db + static_cast<int64_t>(e) * per_expert;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < per_expert; i += stride) {
    d[i] = 0.0f;
  }
}

}  // namespace

void fp8_wgrad_f32(float* db, Fp8Operand dc_t, Fp8Operand x_t, const int32_t* offsets, int groups, int64_t columns,
                   int n_out, int k_in, bool accumulate, const Scratch& scratch, cudaStream_t stream) {
  const char* op = "fp8_grouped_matmul_wgrad (CUTLASS)";
  MOE_CHECK(groups >= 1 && groups <= kMaxGroups, op, ": ", groups, " groups, expected 1..", kMaxGroups);
  const Fp8GroupArrays<GemmWgrad> arr = carve_fp8_arrays<GemmWgrad>(scratch);
  // Row-major operands with `columns` codes per row; db[e] packed [n_out, k_in].
  const auto stride_a = cutlass::make_cute_packed_stride(GemmWgrad::StrideA{}, {n_out, static_cast<int>(columns), 1});
  const auto stride_b = cutlass::make_cute_packed_stride(GemmWgrad::StrideB{}, {k_in, static_cast<int>(columns), 1});
  const auto stride_c = cutlass::make_cute_packed_stride(GemmWgrad::StrideC{}, {n_out, k_in, 1});
  build_wgrad_groups<<<1, kMaxGroups, 0, stream>>>(arr, offsets, groups, columns, n_out, k_in,
                                                   static_cast<const uint8_t*>(dc_t.codes), dc_t.scales,
                                                   static_cast<const uint8_t*>(x_t.codes), x_t.scales, db, stride_a,
                                                   stride_b, stride_c);
  CUDA_CHECK_LAUNCH();
  if (!accumulate) {
    const int64_t per_expert = static_cast<int64_t>(n_out) * k_in;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>((per_expert + 255) / 256, 64)),
                    static_cast<unsigned>(groups));
    zero_skipped_experts<<<grid, 256, 0, stream>>>(db, arr.shapes, per_expert);
    CUDA_CHECK_LAUNCH();
  }
  run_fp8_grouped<GemmWgrad>(arr, groups, accumulate ? 1.0f : 0.0f, scratch, stream, op);
}

void prepare_fp8_wgrad_f32() { prepare_kernel<GemmWgrad>(); }

}  // namespace moe::cuda::cutlass_grouped
#endif

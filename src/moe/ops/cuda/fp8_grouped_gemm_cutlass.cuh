// The CUTLASS side of fp8_grouped_gemm_cutlass.h: the Fp8GroupedGemm<...> type and the code both
// FP8 instantiations share (the per-group argument arrays with their scale pointers, the
// arguments). Included only by fp8_grouped_gemm_cutlass_{nt,wgrad}.cu, each of which instantiates
// one type and holds its own setup kernel. The plumbing (problem shapes on the device, scratch
// carving, the launch, kernel attributes) is the BF16 products' (grouped_gemm_cutlass.cuh).
//
// CUTLASS's view: D (M x N) = alpha A (M x K) B (K x N) + beta C per group, A row-major (K-major),
// B column-major (K-major: rows of an [N, K] array), each with F32 scales per blocks of
// ScaleGranularity (M or N, K = 128) elements, applied to the FP32 accumulators once per 128-deep
// K slice (the DeepSeek-V3 promotion: the tensor cores' FP8 accumulation is not full FP32).
//   forward / data gradient: M = the expert's rows, N = n_out, K = k_in; A = a rows, Rows scales
//     (granularity 1 x 128); B = b[e], Blocks scales (128 x 128); D = c rows, BF16, beta = 0.
//   weight gradient: M = n_out, N = k_in, K = round_up(expert's rows, 128); A = dc_t columns
//     [p_e, p_e + K) (row stride `columns`), B = x_t columns alike, both Columns scales (1 x 128);
//     C = D = db[e] F32, beta = 1 (or 0 when not accumulating).
// The forward's scales are K-major (a row's K blocks contiguous), the weight gradient's M-major (a
// K block's rows contiguous: Columns tiles are tile-major), as moe/ops/fp8.h stores them.
//
// NOTES: per-group scale layouts. The SM90 blockwise mainloop takes an array of per-group scale
// layouts (layout_SFA / layout_SFB) but its device code ignores them (CUTLASS 4.2): load_init builds
// each group's layout as a packed array from the group's (M, N, K) at the group's scale pointer. So
// every operand's scales are stored packed per group, and nothing passes layouts: Rows [m, K / 128]
// (K-major), Blocks [N / 128, K / 128] per expert, Columns tile-major [K / 128, M] with each group
// starting on a 128-row tile (the weight gradient's K spans are padded to 128; M-major). Until the
// thirty-fourth session a subclass of the mainloop read the per-group layouts, from when the
// Columns scales were K-major with a row stride the packed layout did not have.
//
// NOTES: schedule and tiles. KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise, 128x128x128
// tiles (128 is the scale block: one promotion per K tile), 1x2x1 clusters (each A tile loaded once
// for two N tiles, multicast), as in CUTLASS's Hopper FP8 grouped example. Measured at
// bench-olmoe-4l (2026-12-03, bench/RESULTS.md): against 1x1x1, forward and data gradient 0.7-2.6%
// faster alone, the weight gradient within 2%, the step 0.9% faster; 2x1x1 (B multicast) gained
// 0.3%. 2x2x1 and 1x4x1 (fourteenth session) were 10-12% slower in every product (one layer's six
// 978.9 -> 872.4 and 863.2 TFLOP/s) and the step 3.3% slower. Pingpong (64x128x128, measured
// 2026-12-02): equal in fwd/dgrad, slower in wgrad (625 vs 778 TFLOP/s); with C void and 8 stages
// (2026-12-06, H100) the forward and data gradient took 0.95-1.02 pJ/FLOP against 0.75-0.87 and the
// step 3.5% longer (a 64-row tile reads each B tile for half the FLOPs). M-major scales (with K-major
// ones a K tile's 128 row scales are a row stride apart: 128 scattered 4-byte loads per operand and
// K tile): read at M-major addresses (thirty-second session, H100) the weight gradients took 5.8%
// (gate_up) and 3.3% (down) less time, the forward and data gradient 1-2% more; so Columns tiles
// store them M-major and Rows tiles K-major. At the H200's power cap what counts is energy per FLOP: the forward and
// data gradient 0.77-0.80 pJ (the K = 1024 forward down 0.91), the weight gradient 0.96-1.00 (its
// promotion multiplies two scale vectors: an FMUL and an FFMA per accumulator element and K tile),
// cuBLASLt's dense FP8 0.70.
// 128x192 (DeepGEMM's pick at our shapes, fortieth session, H100): the weight scales rearranged per
// 64 columns (a 192-column tile straddles two 128-column blocks) and GmmaFP8Accumulation specialized
// for the 96-float accumulators (CUTLASS 4.2 refuses the two scale vectors, nested differently from
// the accumulator): the forward and data gradient 2-4% slower, the step 0.3% slower (5 stages
// instead of 6; N = 2048 is 10.67 tiles of 192). Not kept.
// A kernel of our own in place of this one (forty-first session, H100, bench/RESULTS.md): correct,
// 25-38% slower with the scales read by the math threads from L2 and the output stored from the
// accumulators. The second version (fp8_grouped_gemm_sm90.h, forty-second session, H100: scales
// copied by the producer, TMA-store epilogue) is 6.5% faster at K = 1024 and 6.5-13% slower at
// K = 2048, the step 1.2% slower; its 2-CTA multicast form (forty-third session) is 3.7% faster at
// K = 1024 and 2.6-5.6% slower at K = 2048, the step 1.1% slower.
// Tried and not kept (2026-12-03, thirteenth session): a mainloop with two temporary accumulators
// that promotes K tile t - 1 while tile t's MMAs run (wait_group 1): every product within 1% of
// the stock collective's, the step unchanged: the promotion already hides behind the other
// consumer warp group's MMAs.
//
// NOTES: shared memory and stages. The stage count is what is left after the epilogue's shared
// memory (StageCountAutoCarveout); a stage is ~33 KB (two 16 KB operand tiles and their scales).
// The forward and data gradient never read C (beta = 0), so their instantiation has C void: the
// epilogue keeps only D's stages (17 KB instead of 34) and the mainloop gets 6 stages instead of 5,
// as cuBLASLt's FP8 kernels run (twenty-eighth session's Nsight Compute). Measured on an H100
// (bench/RESULTS.md, thirtieth session), alternated with 5 stages: the bench-olmoe-4l step's
// expert GEMMs 46.5-46.7 -> 45.2-45.5 ms, FP8 throughput +1.3%. The weight gradient reads C (it
// accumulates into F32 gradients) and keeps 4 stages: a 128x16 epilogue tile gives it 5, which
// gained nothing (same call series: 1.01 / 0.97 -> 1.02 / 0.98 pJ/FLOP, the step unchanged).
// NOTES: CUTLASS must be compiled with -DNDEBUG (grouped_gemm_cutlass.cuh stops a build without it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "moe/ops/cuda/fp8_grouped_gemm_cutlass.h"
#include "moe/ops/cuda/grouped_gemm_cutlass.cuh"

namespace moe::cuda::cutlass_grouped {

constexpr int kFp8ScaleBlock = 128;  // moe::kFp8Tile: the K extent of every scale (and the N extent of Blocks)

// kScaleN: the N extent of B's scale blocks (128: Blocks weights; 1: Columns operands).
// ElementC_: D's type when C is D (in place, read when beta != 0), void for a product that never
// reads C (no C stages in the epilogue's shared memory: NOTES).
// kScalesMajor: how both operands' scales are laid out: K (Rows and Blocks tiles, K blocks fastest)
// or MN (Columns tiles: tile-major, M or N fastest).
template <int kScaleN, class ElementD_, class ElementC_ = ElementD_,
          cute::GMMA::Major kScalesMajor = cute::GMMA::Major::K>
struct Fp8GroupedGemm {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = ElementD_;
  using ElementC = ElementC_;
  using ElementAccumulator = float;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutC = cutlass::layout::RowMajor;
  static constexpr int kAlignA = 128 / cutlass::sizeof_bits<ElementA>::value;  // 16 bytes: TMA
  static constexpr int kAlignB = 128 / cutlass::sizeof_bits<ElementB>::value;
  static constexpr int kAlignC = 128 / cutlass::sizeof_bits<ElementD>::value;  // C's layout when it has one

  using ScaleConfig =
      cutlass::detail::Sm90BlockwiseScaleConfig<1, kScaleN, kFp8ScaleBlock, kScalesMajor, kScalesMajor>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;  // A multicast to the two N tiles (NOTES)
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator, ElementC, LayoutC*,
      kAlignC, ElementD, LayoutC*, kAlignC, EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAccumulator, ElementC>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA*, LayoutSFA*>, kAlignA,
      ElementB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;
};

// The per-group arrays CUTLASS reads (the BF16 products' and each group's two scale pointers), carved
// from the front of the scratch; its workspace follows.
template <class G>
struct Fp8GroupArrays : GroupArrays<G> {
  const float** ptr_sfa;
  const float** ptr_sfb;
};

template <class G>
Fp8GroupArrays<G> carve_fp8_arrays(const Scratch& scratch) {
  char* cursor = static_cast<char*>(scratch.base);
  Fp8GroupArrays<G> arr;
  carve_group_arrays<G>(cursor, arr);
  arr.ptr_sfa = carve<const float*>(cursor);
  arr.ptr_sfb = carve<const float*>(cursor);
  give_rest_as_workspace<G>(scratch, cursor, arr);
  return arr;
}

// The grouped GEMM on `stream`, after the product's setup kernel filled `arr` on the same stream.
template <class G>
void run_fp8_grouped(const Fp8GroupArrays<G>& arr, int groups, float beta, const Scratch& scratch,
                     cudaStream_t stream, const char* op) {
  using Gemm = typename G::Gemm;
  typename Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion{};
  fusion.alpha = 1.0f;
  fusion.beta = beta;  // 0: C is never read (stale NaNs in the output do not leak)
  args = typename Gemm::Arguments{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {groups, arr.shapes, nullptr},  // problem shapes only on the device
      {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b, arr.ptr_sfa, nullptr, arr.ptr_sfb, nullptr},  // layouts: NOTES
      {fusion, arr.ptr_c, arr.stride_c, arr.ptr_d, arr.stride_d},
      hardware_info(scratch)};
  launch_grouped<G>(args, arr, stream, op);
}

}  // namespace moe::cuda::cutlass_grouped

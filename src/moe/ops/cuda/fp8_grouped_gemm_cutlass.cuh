// The CUTLASS side of fp8_grouped_gemm_cutlass.h: the Fp8GroupedGemm<...> type and the code both
// FP8 instantiations share (the per-group argument arrays, the launch). Included only by
// fp8_grouped_gemm_cutlass_{nt,wgrad}.cu, each of which instantiates one type and holds its own
// setup kernel. The plumbing (problem shapes on the device, scratch carving, kernel attributes)
// is the BF16 products' (grouped_gemm_cutlass.cuh).
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
// layouts (layout_SFA / layout_SFB) but, as of CUTLASS 4.2 (and upstream main when this was
// written), its device code ignores them: load_init rebuilds each group's layout as a packed array
// from the group's (M, N, K). That matched the forward's operands, not the weight gradient's
// columns operands while their scales were K-major (rows `columns / 128` scales apart while a group
// spans only K / 128 of them). MainloopWithGroupScaleLayouts below reads the per-group layouts
// CUTLASS already carries to the device (one load per group change, in the two producer warps);
// nothing else of the collective changes. Since the columns scales are tile-major (M-major: a
// group's block is a packed [K / 128, M] array, thirty-second session) the packed layout would
// match them too, so the subclass may be redundant; it stays until a GPU run checks without it.
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

// The stock collective, except that each group's scale tensors take the group's entry of the
// layout_SFA / layout_SFB arrays (NOTES above). The kernel calls tensors_perform_update, in both
// producer warps, before the first load of every group.
template <class Stock>
struct MainloopWithGroupScaleLayouts : Stock {
  static_assert(Stock::IsGroupedGemmKernel, "per-group scale layouts exist only in the grouped kernel");

  template <class InputTensors, class ProblemShape_MNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const& /*previous group's*/,
                                                     typename Stock::Params const& params,
                                                     ProblemShape_MNKL problem_shape_mnkl, int32_t next_group) {
    const InputTensors packed = this->load_init(problem_shape_mnkl, params);  // A and B as the stock collective
    return cute::make_tuple(
        cute::get<0>(packed), cute::get<1>(packed),
        cute::make_tensor(cute::make_gmem_ptr(params.ptr_SFA[next_group]), params.layout_SFA[next_group]),
        cute::make_tensor(cute::make_gmem_ptr(params.ptr_SFB[next_group]), params.layout_SFB[next_group]));
  }
};

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

  using StockMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA*, LayoutSFA*>, kAlignA,
      ElementB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using CollectiveMainloop = MainloopWithGroupScaleLayouts<StockMainloop>;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;
};

// A K-major scale layout: `blocks_mn` rows (scale blocks of kVecMN elements along M or N) of
// `blocks_k` scales, consecutive rows `row_stride` scales apart. L = 1: the batch stride is unused.
template <class Layout, int kVecMN>
__device__ inline Layout k_major_scales(int blocks_mn, int blocks_k, int row_stride) {
  using namespace cute;
  return Layout(make_shape(make_shape(Int<kVecMN>{}, blocks_mn), make_shape(Int<kFp8ScaleBlock>{}, blocks_k), 1),
                make_stride(make_stride(_0{}, row_stride), make_stride(_0{}, _1{}), 0));
}

// An MN-major scale layout (Columns tiles, per-element scales along M or N): `blocks_mn` scales per
// K block, consecutive K blocks `k_stride` scales apart.
template <class Layout>
__device__ inline Layout mn_major_scales(int blocks_mn, int blocks_k, int k_stride) {
  using namespace cute;
  return Layout(make_shape(make_shape(_1{}, blocks_mn), make_shape(Int<kFp8ScaleBlock>{}, blocks_k), 1),
                make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, k_stride), 0));
}

// The per-group arrays CUTLASS reads, carved from the front of the scratch; its workspace follows.
template <class G>
struct Fp8GroupArrays {
  GroupShape* shapes;
  const typename G::ElementA** ptr_a;
  const typename G::ElementB** ptr_b;
  const typename G::ElementC** ptr_c;
  typename G::ElementD** ptr_d;
  typename G::StrideA* stride_a;
  typename G::StrideB* stride_b;
  typename G::StrideC* stride_c;
  typename G::StrideD* stride_d;
  const float** ptr_sfa;
  const float** ptr_sfb;
  typename G::LayoutSFA* layout_sfa;
  typename G::LayoutSFB* layout_sfb;
  void* workspace;
  size_t workspace_bytes;
};

template <class G>
Fp8GroupArrays<G> carve_fp8_arrays(const Scratch& scratch) {
  char* cursor = static_cast<char*>(scratch.base);
  Fp8GroupArrays<G> arr;
  arr.shapes = carve<GroupShape>(cursor);
  arr.ptr_a = carve<const typename G::ElementA*>(cursor);
  arr.ptr_b = carve<const typename G::ElementB*>(cursor);
  arr.ptr_c = carve<const typename G::ElementC*>(cursor);
  arr.ptr_d = carve<typename G::ElementD*>(cursor);
  arr.stride_a = carve<typename G::StrideA>(cursor);
  arr.stride_b = carve<typename G::StrideB>(cursor);
  arr.stride_c = carve<typename G::StrideC>(cursor);
  arr.stride_d = carve<typename G::StrideD>(cursor);
  arr.ptr_sfa = carve<const float*>(cursor);
  arr.ptr_sfb = carve<const float*>(cursor);
  arr.layout_sfa = carve<typename G::LayoutSFA>(cursor);
  arr.layout_sfb = carve<typename G::LayoutSFB>(cursor);
  const size_t used = static_cast<size_t>(cursor - static_cast<char*>(scratch.base));
  MOE_CHECK(used < kScratchBytes, "FP8 grouped GEMM (CUTLASS): ", used, " bytes of group arrays exceed the ",
            kScratchBytes, "-byte scratch");
  arr.workspace = cursor;
  arr.workspace_bytes = kScratchBytes - used;
  return arr;
}

// The grouped GEMM on `stream`, after the product's setup kernel filled `arr` on the same stream.
// Host work: CUTLASS's parameter struct (placeholder TMA descriptors; each SM rewrites them per
// group on the device), no device calls.
template <class G>
void run_fp8_grouped(const Fp8GroupArrays<G>& arr, int groups, float beta, const Scratch& scratch,
                     cudaStream_t stream, const char* op) {
  using Gemm = typename G::Gemm;
  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = scratch.device;
  hw_info.sm_count = scratch.sm_count;
  typename Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion{};
  fusion.alpha = 1.0f;
  fusion.beta = beta;  // 0: C is never read (stale NaNs in the output do not leak)
  args = typename Gemm::Arguments{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {groups, arr.shapes, nullptr},  // problem shapes only on the device
      {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b, arr.ptr_sfa, arr.layout_sfa, arr.ptr_sfb, arr.layout_sfb},
      {fusion, arr.ptr_c, arr.stride_c, arr.ptr_d, arr.stride_d},
      hw_info};
  const size_t workspace_bytes = Gemm::get_workspace_size(args);
  MOE_CHECK(workspace_bytes <= arr.workspace_bytes, op, ": CUTLASS wants ", workspace_bytes,
            " workspace bytes, the scratch has ", arr.workspace_bytes);
  cutlass::Status status = Gemm::can_implement(args);
  MOE_CHECK(status == cutlass::Status::kSuccess, op, ": CUTLASS cannot run this problem: ", status_name(status));
  status = G::Kernel::initialize_workspace(args, arr.workspace, stream);
  MOE_CHECK(status == cutlass::Status::kSuccess, op, ": CUTLASS workspace: ", status_name(status));
  typename Gemm::Params params = G::Kernel::to_underlying_arguments(args, arr.workspace);
  status = Gemm::run(params, stream);
  MOE_CHECK(status == cutlass::Status::kSuccess, op, ": CUTLASS launch failed: ", status_name(status));
  CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda::cutlass_grouped

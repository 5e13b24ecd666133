// The CUTLASS side of grouped_gemm_cutlass.h: one GroupedGemm<...> type per product and the code
// every instantiation shares (the per-group setup kernel, the argument plumbing, the launch).
// Included only by grouped_gemm_cutlass_{fwd,dgrad,wgrad}.cu, each of which instantiates one type.
//
// CUTLASS's view of a product is D (M x N) = alpha A (M x K) B (K x N) + beta C with per-group
// pointers, strides and (M, N, K) read from device arrays (GroupProblemShape, no host copy).
//   forward / backward data: M = the expert's rows, N = n_out, K = k_in; A = a rows (row-major),
//     B = b[e] (trans_b: [n_out, k_in], i.e. column-major K x N; else [k_in, n_out], row-major),
//     C = D = c rows (row-major). A group's M is its row count, so the TMA loads and stores stop at
//     the expert's last row: rows of neighbouring experts and rows past offsets[E] are never read
//     or written.
//   weight gradient: M = n_out, N = k_in, K = the expert's rows; A = dc rows read transposed
//     (column-major M x K, leading dim n_out), B = a rows (row-major K x N), C = D = db[e] F32 with
//     beta = 1.
//
// NOTES: schedule and tiles. KernelPtrArrayTmaWarpSpecializedCooperative with 128x256x64 tiles
// (BF16: 64 elements = 128 bytes of K per stage) and 1x2x1 clusters (the A tile is multicast to
// the two CTAs of a cluster): both consumer warp groups work on one 128x256 tile, so each operand
// byte brought from L2 feeds twice the output of a 128x128 tile. Chosen by energy, not by burst
// speed: a Hopper GPU runs these products at its 700 W limit, where a kernel's time is its energy
// per FLOP. bench/expert_gemm_variants (each configuration ~1 s back to back on random operands,
// NVML energy) measured on an H100 at bench-olmoe-4l and fig4 shapes (bench/RESULTS.md,
// twenty-fifth session): 1.02-1.17 pJ/FLOP against 1.26-1.78 for the pingpong 128x128x64 2x1
// kernel used before, the six products of a bench-olmoe-4l layer 15.5 ms against 21.3 ms. On an H200
// alone the pingpong kernel ran bench-olmoe-4l's products ~2% faster and fig4's 14% slower; in
// the step the cooperative kernel won at both (BF16 bench-olmoe-4l +5.6%, fig4 +13.7%).
// (GPU.md's early H200 figure, pingpong 670-700 TFLOP/s against 500 for cooperative 256x128, was
// timed in short bursts below the power limit.) The three products share the configuration; the
// bench lists the alternatives tried per product.
//
// NOTES: CUTLASS must be compiled with -DNDEBUG: without it ptxas serializes the WGMMAs (C7510)
// and the kernels run 1.1-1.5x slower (GPU.md). CMake builds these files with -DNDEBUG, the #error
// below stops a build without it, and the moe_ops compiler launcher fails any compile whose ptxas
// output names C7510 (nvcc 13 prints it as "info", which -Xptxas=-Werror lets through).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/grouped_gemm_cutlass.h"

#if !defined(NDEBUG)
#error "grouped_gemm_cutlass: build CUTLASS kernels with -DNDEBUG (without it the WGMMAs are serialized)"
#endif

namespace moe::cuda::cutlass_grouped {

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;  // (M, N, K) per group
using GroupShape = ProblemShape::UnderlyingProblemShape;

// The tile, cluster and schedules default to the configuration the library runs (NOTES above);
// bench/expert_gemm_variants instantiates others to compare them on a GPU.
template <class LayoutA_, class LayoutB_, class ElementD_,
          class TileShape_ = cute::Shape<cute::_128, cute::_256, cute::_64>,
          class ClusterShape_ = cute::Shape<cute::_1, cute::_2, cute::_1>,
          class KernelSchedule_ = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
          class EpilogueSchedule_ = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>
struct GroupedGemm {
  using ElementA = cutlass::bfloat16_t;
  using ElementB = cutlass::bfloat16_t;
  using ElementD = ElementD_;
  using ElementC = ElementD_;  // C is D (in place), read only when beta != 0
  using ElementAccumulator = float;
  using LayoutA = LayoutA_;
  using LayoutB = LayoutB_;
  using LayoutC = cutlass::layout::RowMajor;
  static constexpr int kAlignA = 128 / cutlass::sizeof_bits<ElementA>::value;  // 16 bytes: TMA
  static constexpr int kAlignB = 128 / cutlass::sizeof_bits<ElementB>::value;
  static constexpr int kAlignC = 128 / cutlass::sizeof_bits<ElementC>::value;

  using TileShape = TileShape_;
  using ClusterShape = ClusterShape_;
  using KernelSchedule = KernelSchedule_;
  using EpilogueSchedule = EpilogueSchedule_;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementAccumulator, ElementC, LayoutC*,
      kAlignC, ElementD, LayoutC*, kAlignC, EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, ElementAccumulator>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA*, kAlignA, ElementB, LayoutB*, kAlignB,
      ElementAccumulator, TileShape, ClusterShape,
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

// The operand layouts and output type of each expert product (the top of this file; ExpertProduct
// in grouped_gemm_cutlass.h), for any tile, cluster and schedule: the library's instantiations
// (grouped_gemm_cutlass_{fwd,dgrad,wgrad}.cu) and bench/expert_gemm_variants take them from here.
//   kForward: c = a b[e]^T (A row-major, B column-major, BF16 out); kDataGrad: c = a b[e] (both
//   row-major, BF16 out); kWeightGrad: db[e] = dc^T a (A column-major, B row-major, F32 out).
template <ExpertProduct P, class... Config>
using ExpertGemm = GroupedGemm<
    std::conditional_t<P == ExpertProduct::kWeightGrad, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>,
    std::conditional_t<P == ExpertProduct::kForward, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>,
    std::conditional_t<P == ExpertProduct::kWeightGrad, float, cutlass::bfloat16_t>, Config...>;

// The per-group arrays CUTLASS reads, carved from the front of the scratch; its workspace follows.
template <class G>
struct GroupArrays {
  GroupShape* shapes;
  const typename G::ElementA** ptr_a;
  const typename G::ElementB** ptr_b;
  const typename G::ElementC** ptr_c;
  typename G::ElementD** ptr_d;
  typename G::StrideA* stride_a;
  typename G::StrideB* stride_b;
  typename G::StrideC* stride_c;
  typename G::StrideD* stride_d;
  void* workspace;
  size_t workspace_bytes;
};

template <class T>
T* carve(char*& cursor) {
  constexpr uintptr_t kAlign = 256;
  T* p = reinterpret_cast<T*>(cursor);
  cursor += (sizeof(T) * kMaxGroups + kAlign - 1) / kAlign * kAlign;
  return p;
}

// Carves the arrays of GroupArrays<G> from `cursor` on.
template <class G>
void carve_group_arrays(char*& cursor, GroupArrays<G>& arr) {
  arr.shapes = carve<GroupShape>(cursor);
  arr.ptr_a = carve<const typename G::ElementA*>(cursor);
  arr.ptr_b = carve<const typename G::ElementB*>(cursor);
  arr.ptr_c = carve<const typename G::ElementC*>(cursor);
  arr.ptr_d = carve<typename G::ElementD*>(cursor);
  arr.stride_a = carve<typename G::StrideA>(cursor);
  arr.stride_b = carve<typename G::StrideB>(cursor);
  arr.stride_c = carve<typename G::StrideC>(cursor);
  arr.stride_d = carve<typename G::StrideD>(cursor);
}

// The workspace: the rest of the scratch after the arrays, which end at `cursor`.
template <class G>
void give_rest_as_workspace(const Scratch& scratch, const char* cursor, GroupArrays<G>& arr) {
  const size_t used = static_cast<size_t>(cursor - static_cast<char*>(scratch.base));
  MOE_CHECK(used < kScratchBytes, "grouped GEMM (CUTLASS): ", used, " bytes of group arrays exceed the ", kScratchBytes,
            "-byte scratch");
  arr.workspace = static_cast<char*>(scratch.base) + used;
  arr.workspace_bytes = kScratchBytes - used;
}

template <class G>
GroupArrays<G> carve_arrays(const Scratch& scratch) {
  char* cursor = static_cast<char*>(scratch.base);
  GroupArrays<G> arr;
  carve_group_arrays(cursor, arr);
  give_rest_as_workspace(scratch, cursor, arr);
  return arr;
}

// One thread per expert: shapes, pointers and strides of group e from expert_offsets.
//   forward, data gradient: x = a [rows, k_in], y = b [E, n_out x k_in], out = c [rows, n_out].
//   weight gradient:        x = dc [rows, n_out], y = a [rows, k_in], out = db [E, n_out, k_in].
template <class G, ExpertProduct kProduct>
__global__ void build_group_arrays(GroupArrays<G> arr, const int32_t* __restrict__ offsets, int groups, int64_t rows,
                                   int n_out, int k_in, const typename G::ElementA* x, const typename G::ElementB* y,
                                   typename G::ElementD* out, typename G::StrideA stride_a,
                                   typename G::StrideB stride_b, typename G::StrideC stride_c,
                                   typename G::StrideD stride_d) {
  const int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (e >= groups) return;
  // Clamped into [0, rows] as in the tiled kernels: bad offsets give wrong ranges, never stray rows.
  const int64_t lo = min(max(static_cast<int64_t>(offsets[e]), int64_t{0}), rows);
  const int64_t hi = min(max(static_cast<int64_t>(offsets[e + 1]), int64_t{0}), rows);
  const int m = hi > lo ? static_cast<int>(hi - lo) : 0;
  if constexpr (kProduct != ExpertProduct::kWeightGrad) {
    arr.shapes[e] = GroupShape(m, n_out, k_in);  // m = 0: no tiles, the group is skipped
    arr.ptr_a[e] = x + lo * k_in;
    arr.ptr_b[e] = y + static_cast<int64_t>(e) * n_out * k_in;
    arr.ptr_c[e] = out + lo * n_out;
    arr.ptr_d[e] = out + lo * n_out;
  } else {
    // NOTES: an expert with no rows gets M = 0 (no tiles) rather than K = 0: with K = 0 the
    // epilogue would still rewrite db[e] as 1 * db[e] + 0, which turns -0 into +0; skipping it
    // leaves db[e] bit-identical, as on the CPU.
    arr.shapes[e] = GroupShape(m > 0 ? n_out : 0, k_in, m);
    arr.ptr_a[e] = x + lo * n_out;
    arr.ptr_b[e] = y + lo * k_in;
    arr.ptr_c[e] = out + static_cast<int64_t>(e) * n_out * k_in;
    arr.ptr_d[e] = out + static_cast<int64_t>(e) * n_out * k_in;
  }
  arr.stride_a[e] = stride_a;
  arr.stride_b[e] = stride_b;
  arr.stride_c[e] = stride_c;
  arr.stride_d[e] = stride_d;
}

inline const char* status_name(cutlass::Status s) { return cutlass::cutlassGetStatusString(s); }

inline cutlass::KernelHardwareInfo hardware_info(const Scratch& scratch) {
  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = scratch.device;
  hw_info.sm_count = scratch.sm_count;
  return hw_info;
}

// The grouped GEMM of G with `args` on `stream`, after a setup kernel filled the group arrays (and
// their workspace follows them: arr.workspace) on the same stream. Host work: CUTLASS's parameter
// struct (placeholder TMA descriptors; each SM rewrites them per group on the device), no device
// calls.
template <class G>
void launch_grouped(const typename G::Gemm::Arguments& args, const GroupArrays<G>& arr, cudaStream_t stream,
                    const char* op) {
  using Gemm = typename G::Gemm;
  const size_t workspace_bytes = Gemm::get_workspace_size(args);
  MOE_CHECK(workspace_bytes <= arr.workspace_bytes, op, ": CUTLASS wants ", workspace_bytes,
            " workspace bytes, the scratch has ", arr.workspace_bytes);
  cutlass::Status status = Gemm::can_implement(args);
  MOE_CHECK(status == cutlass::Status::kSuccess, op, ": CUTLASS cannot run this problem: ", status_name(status));
  // Gemm::initialize without its cudaFuncSetAttribute on every call (prepare_kernel does it once).
  // For this kernel initialize_workspace launches nothing; were it to, it would run on `stream`.
  status = G::Kernel::initialize_workspace(args, arr.workspace, stream);
  MOE_CHECK(status == cutlass::Status::kSuccess, op, ": CUTLASS workspace: ", status_name(status));
  typename Gemm::Params params = G::Kernel::to_underlying_arguments(args, arr.workspace);
  status = Gemm::run(params, stream);
  MOE_CHECK(status == cutlass::Status::kSuccess, op, ": CUTLASS launch failed: ", status_name(status));
  CUDA_CHECK_LAUNCH();
}

// Setup kernel, then the grouped GEMM, both on `stream`.
template <class G, ExpertProduct kProduct>
void run_grouped(void* out, const void* x, const void* y, const int32_t* offsets, int groups, int64_t rows, int n_out,
                 int k_in, float beta, const Scratch& scratch, cudaStream_t stream, const char* op) {
  MOE_CHECK(groups >= 1 && groups <= kMaxGroups, op, ": ", groups, " groups, expected 1..", kMaxGroups);
  const GroupArrays<G> arr = carve_arrays<G>(scratch);
  // Strides do not depend on a group's row count (L = 1): the same for every group.
  const int M = kProduct != ExpertProduct::kWeightGrad ? 1 : n_out;  // the row-count extent is never a stride
  const int N = kProduct != ExpertProduct::kWeightGrad ? n_out : k_in;
  const int K = kProduct != ExpertProduct::kWeightGrad ? k_in : 1;
  const auto stride_a = cutlass::make_cute_packed_stride(typename G::StrideA{}, {M, K, 1});
  const auto stride_b = cutlass::make_cute_packed_stride(typename G::StrideB{}, {N, K, 1});
  const auto stride_c = cutlass::make_cute_packed_stride(typename G::StrideC{}, {M, N, 1});
  const auto stride_d = cutlass::make_cute_packed_stride(typename G::StrideD{}, {M, N, 1});
  constexpr int kSetupThreads = 128;
  build_group_arrays<G, kProduct><<<(groups + kSetupThreads - 1) / kSetupThreads, kSetupThreads, 0, stream>>>(
      arr, offsets, groups, rows, n_out, k_in, static_cast<const typename G::ElementA*>(x),
      static_cast<const typename G::ElementB*>(y), static_cast<typename G::ElementD*>(out), stride_a, stride_b,
      stride_c, stride_d);
  CUDA_CHECK_LAUNCH();

  using Gemm = typename G::Gemm;
  typename Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion{};
  fusion.alpha = 1.0f;
  fusion.beta = beta;  // 0: C is never read (stale NaNs in c do not leak), as with the CPU's beta = 0
  // Problem shapes only on the device (host pointer nullptr): the grid is the persistent SM count
  // and each CTA walks the groups' tile counts itself.
  args = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                  {groups, arr.shapes, nullptr},
                                  {arr.ptr_a, arr.stride_a, arr.ptr_b, arr.stride_b},
                                  {fusion, arr.ptr_c, arr.stride_c, arr.ptr_d, arr.stride_d},
                                  hardware_info(scratch)};
  launch_grouped<G>(args, arr, stream, op);
}

template <class G>
void prepare_kernel() {
  const int smem = static_cast<int>(G::Kernel::SharedStorageSize);
  CUDA_CHECK(cudaFuncSetAttribute(cutlass::device_kernel<typename G::Kernel>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
}

}  // namespace moe::cuda::cutlass_grouped

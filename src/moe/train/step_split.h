// The step-time split `moetrain bench` prints on the GPU: the profiled kernels (KernelProfiler)
// in groups of one kind, and how far each group runs from its ceiling, both measured in the same
// process: a large cuBLAS BF16 GEMM gives the matrix-product ceiling, a device-to-device copy the
// memory ceiling. Each group's work is the rank's StepWork (step_work.h, the counts the
// performance model uses too):
//   expert GEMMs    CUTLASS grouped GEMMs; FLOPs of the routed experts (recompute included)
//   dense GEMMs     cuBLAS(Lt) products; FLOPs of the other matrix products (attention projections,
//                   router, shared expert, dense MLPs, LM head)
//   attention       cuDNN SDPA; 12 x layers x seq x d_q FLOPs per token, the MFU convention (the
//                   full square: a causal kernel does about half of it)
//   FP8 quantize    train.precision = "fp8": the quantize kernels (activation operands and output
//                   gradients by rows and by columns, the SwiGLU forwards that quantize, the FP8
//                   re-quantize, the dense products' scale staging); bytes as step_work.cpp lists them
//   FP8 cache       the caches' own quantize pass from the FP32 weights, once per step, with several
//                   data-parallel ranks in a stage (bytes); with one, AdamW writes them (AdamW row)
// With FP8 the expert and dense GEMM groups are measured against an FP8 GEMM ceiling (the
// block-scaled dense FP8 matmul at 8192^3, same process; the dense group still holds the BF16
// router and LM head); attention, BF16 in both precisions, against the BF16 one.
//   AdamW update    bytes: 28 per parameter (param, m, v read and written, grad read), 30 where the
//                   update also writes the BF16 compute copy (one rank, or FSDP); 8 fewer with BF16 moments
//   gradient norm   bytes: 4 per parameter read
//   other           element-wise, norms, routing, loss, copies, gradient zeroing: bytes of step_work.h
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "moe/core/kernel_profiler.h"
#include "moe/train/step_work.h"

namespace moe {

struct Ceilings {
  double gemm_tflops = 0;  // BF16 GEMM, 8192 x 8192 x 8192, cuBLASLt (0: not measured)
  double fp8_gemm_tflops = 0;  // FP8 block-scaled GEMM (1x128 x 128x128 scales), 8192^3, cuBLASLt; 0: not
                               // measured (not asked for, or not a Hopper GPU)
  double copy_tb_s = 0;    // device-to-device copy of 1 GiB, bytes read + written per second
  std::string why_not;     // why nothing was measured (no GPU, no memory left)
};

// Measures the ceilings on the current GPU (median of several runs; allocates ~2.4 GiB for the
// measurement and frees it), the FP8 one when `fp8` (Hopper only). Without a GPU, returns zeros and the reason.
Ceilings measure_ceilings(bool fp8 = false);

enum class KernelGroup { ExpertGemm, DenseGemm, Attention, Fp8Quantize, Fp8Cache, AdamW, GradNorm, Other };
const char* kernel_group_name(KernelGroup g);
// The group of a kernel by its (mangled or plain) name.
KernelGroup kernel_group(std::string_view name);

struct SplitRow {
  KernelGroup group = KernelGroup::Other;
  double ms_per_step = 0;
  double share = 0;     // of all recorded GPU time
  double rate = 0;      // TFLOP/s or TB/s achieved; 0 when the group's work is not counted
  double ceiling = 0;   // the measured ceiling in the same unit; 0 when none applies
  const char* unit = "";  // "TFLOP/s", "TB/s" or ""
  double fp8_cache_ms = 0;  // AdamW with one rank per stage in FP8: the caches' share (by bytes) of its time
};

// Rows for every group with recorded time, in KernelGroup order. entries: all of the profiler's
// entries; steps: the steps they cover; work: this rank's work per step (step_work()).
std::vector<SplitRow> split_step(const std::vector<KernelProfiler::Entry>& entries, int steps, const StepWork& work,
                                 const Ceilings& ceilings);
std::string format_step_split(const std::vector<SplitRow>& rows, const Ceilings& ceilings);

}  // namespace moe

// The step-time split `moetrain bench` prints on the GPU: the profiled kernels (KernelProfiler)
// in groups of one kind, and how far each group runs from its ceiling, both measured in the same
// process: a large cuBLAS BF16 GEMM gives the matrix-product ceiling, a device-to-device copy the
// memory ceiling.
//   expert GEMMs    CUTLASS grouped GEMMs; work: 6 x tokens x K x 3 x d x h per MoE layer (FLOPs)
//   dense GEMMs     cuBLAS(Lt) products; work: 6 x tokens x the other matrix-product parameters
//                   (attention projections, router, shared expert, dense MLPs, LM head)
//   attention       cuDNN SDPA; work: 12 x layers x seq x d_q per token, the MFU convention (the
//                   full square: a causal kernel does about half of it)
//   FP8 quantize    train.precision = "fp8": the activation operands quantized before each FP8
//                   product (and their scales staged for cuBLASLt): time only
//   FP8 cache       the weights' FP8 caches quantized from the FP32 weights once per step: time only
// With FP8 the GEMM groups are measured against an FP8 GEMM ceiling (the block-scaled dense FP8
// matmul at 8192^3, same process); the dense group still holds the BF16 router and LM head.
//   AdamW update    bytes: 28 per parameter (param, m, v read and written, grad read), 30 where the
//                   update also writes the BF16 compute copy (one rank, or FSDP)
//   gradient norm   bytes: 4 per parameter read
//   other           element-wise, norms, routing, copies: time only (their bytes are not counted)
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "moe/core/kernel_profiler.h"
#include "moe/train/flops.h"

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
};

// Rows for every group with recorded time, in KernelGroup order. entries: all of the profiler's
// entries; steps: the steps they cover; tokens_per_step: tokens this GPU trains per step;
// params_updated: parameters this GPU's optimizer updates per step; adamw_bytes_per_param: 28, or
// 30 when the update writes the BF16 copy too.
std::vector<SplitRow> split_step(const std::vector<KernelProfiler::Entry>& entries, int steps, const FlopCount& flops,
                                 double tokens_per_step, double params_updated, double adamw_bytes_per_param,
                                 const Ceilings& ceilings);
std::string format_step_split(const std::vector<SplitRow>& rows, const Ceilings& ceilings);

}  // namespace moe

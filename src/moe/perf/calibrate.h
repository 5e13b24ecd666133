// `moetrain bench --calibrate OUT.json`: measures a hardware profile's efficiencies on this GPU with
// moetrain's own kernels, median of several timed calls after as many warm-up calls (time_gpu):
//   gemm_dense_bf16     cuBLASLt x[16384, d] W[d, d]^T at d = 1024, 2048, 4096; d = 8192 from the
//                       8192^3 ceiling of measure_ceilings (step_split.h)
//   gemm_dense_fp8      the block-scaled FP8 8192^3 ceiling (Hopper)
//   gemm_grouped_bf16   the CUTLASS grouped gate/up product (d 2048 -> 2h 2048) forward, data
//                       gradient and weight gradient (F32, written) at 256, 1024, 4096 and 16384
//                       rows per expert
//   attention           cuDNN SDPA forward + backward, 16 heads of 128, 32768 tokens, seq 2048,
//                       4096, 8192 (fraction of peak at the full-square FLOP count)
//   elementwise         RMSNorm forward, SwiGLU forward and backward at OLMoE sizes (bytes moved)
//   fp8_quantize        FP8 row quantization of [32768, 2048] BF16 (Hopper)
//   optimizer           the device-to-device copy ceiling
// and, under mpirun with several ranks (one per GPU), the links: NCCL reduce-scatter and
// all-gather of 1 MiB to 1 GiB (bus bandwidth; collective_inter when the ranks span several hosts,
// else collective_intra) and the rowwise dispatch and combine of routed rows (dispatch_intra).
// Those are the curves' points: what the kernels reach alone. Inside a training step they run
// slower, so it also times 8 steps of the built-in bench-olmoe-4l (the reference model) on each
// GPU alone with the kernel profiler, in BF16 and, on Hopper, in FP8, and fits the in-step factors
// of the compute curves to the step split (step_fit.h): element-wise ("other"), optimizer, expert
// and dense GEMMs and attention from the BF16 step; FP8 quantization and the FP8 GEMMs from the
// FP8 step.
// Everything else (peaks, memory, curves not measured) is kept from the base profile; the result
// is marked measured and its source says what was measured, where and when.
#pragma once

#include <string>

#include "moe/comm/communicator.h"
#include "moe/perf/hardware_profile.h"

namespace moe {

// Collective over `world` (every rank measures; rank 0's numbers are returned on rank 0). Prints
// each measurement on rank 0 as it is taken. Throws without a GPU (or in a build without CUDA).
HardwareProfile calibrate_hardware(const HardwareProfile& base, Communicator& world);

}  // namespace moe

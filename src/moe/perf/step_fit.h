// A hardware profile's in-step factors fitted to whole training steps (`moetrain bench --calibrate`,
// calibrate.h). Kernels timed alone run faster than inside a step (the step's smaller element-wise
// kernels, launch gaps, clocks under the step's power draw), so the calibration also times a
// reference step with the kernel profiler and fits each curve's in-step factor
// (hardware_profile.h) from the step split (step_split.h: GPU ms per step of each kernel group)
// and the step's work (step_work.h, the FLOPs and bytes the performance model predicts from):
//   in-step efficiency = work / (peak x the group's measured time)
//   factor             = in-step efficiency / the curve's points at the reference's x
// so the model (step_model.h) predicts each group's measured time for the reference step, and
// the curve keeps the shape its points measured alone.
//
// BF16 step (train.precision = bf16):
//   optimizer          AdamW + gradient norm groups: AdamW and gradient-norm bytes
//   elementwise        "other": the model's element-wise bytes (the profile's element-wise part;
//                      gradient zeroing and the other optimizer bytes are in the optimizer part)
//   gemm_grouped_bf16  expert GEMMs: routed-expert FLOPs at the reference's rows per expert, less
//                      the F32 expert-gradient reads (at the optimizer rate) where microbatches accumulate
//   gemm_dense_bf16    dense GEMMs: dense FLOPs at the reference's d_model
//   attention          attention: attention FLOPs (full square) at the reference's seq_len
// FP8 step (train.precision = fp8), after the BF16 fit:
//   fp8_quantize       FP8 quantize (+ FP8 cache, where several ranks refresh the caches in a pass of
//                      their own; one rank writes them inside AdamW): quantize and cache bytes
//   gemm_grouped_fp8   expert GEMMs: routed-expert FLOPs, all FP8
//   gemm_dense_fp8     dense GEMMs less the time of its BF16 products (router, LM head) at the fitted
//                      gemm_dense_bf16 curve: the FP8 dense FLOPs
#pragma once

#include <string>
#include <vector>

#include "moe/perf/hardware_profile.h"
#include "moe/train/step_split.h"
#include "moe/train/step_work.h"

namespace moe {

// A profiled training step: what ran, its split and its work.
struct ReferenceStep {
  std::string name;             // named in the fitted sources, e.g. "bench-olmoe-4l (7 profiled steps)"
  std::vector<SplitRow> split;  // split_step() over the profiled steps
  StepWork work;                // step_work() of the same config and layout
  double d_model = 0;           // the dense GEMM curves' x
  double seq_len = 0;           // the attention curve's x
};

// One fitted factor, for the calibration's printout.
struct InStepFit {
  std::string curve;      // the profile's key
  std::string groups;     // the split's groups it was fitted to
  double ms = 0;          // their GPU time per step (less what other parts of the model account for)
  double efficiency = 0;  // in the step: fraction of the peak
  double alone = 0;       // the curve's points at the reference's x
  double factor = 0;      // efficiency / alone: the curve's new in_step
};

// Set the BF16 step's factors in `p` (the list above); throws naming the group when a group the
// fit needs has no time in the split, or the step is not a BF16 one, and naming the curve when its
// factor is one a profile file cannot hold (hardware_profile.h: from 1e-3 to 2, and no point times
// it past the curve's max_efficiency), so the calibration never writes a profile `plan` refuses.
std::vector<InStepFit> fit_bf16_step(HardwareProfile& p, const ReferenceStep& ref);
// Set the FP8 step's factors; call after fit_bf16_step. Throws as fit_bf16_step, and when the
// dense GEMMs took no longer than their BF16 products alone would.
std::vector<InStepFit> fit_fp8_step(HardwareProfile& p, const ReferenceStep& ref);

}  // namespace moe

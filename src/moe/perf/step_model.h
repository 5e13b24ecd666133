// The performance model: one rank's predicted step time, split as `moetrain bench` splits the
// measured one, from the rank's work (train/step_work.h: the counts the trainer's MFU and step
// split use) and a hardware profile (hardware_profile.h):
//   matrix products   FLOPs / (peak x efficiency of the shape class): expert GEMMs by rows per
//                     expert, dense GEMMs by d_model, attention by seq_len; FP8 products at the FP8
//                     peak with the FP8 curves
//   memory-bound      bytes / (memory bandwidth x efficiency): element-wise and routing passes,
//                     the expert gradients' accumulation reads, FP8 quantization, optimizer
//   gradient sync     ZeRO-1 ring reduce-scatter (F32) + all-gather (F32) of each replica group:
//                     2 x 4 bytes x params x (n-1)/n over the link, in 16 MiB buckets
//   dispatch/combine  the routed rows that cross to other GPUs of the EP group (step_work.h),
//                     over the link at the rowwise dispatch efficiency
//   FSDP gathers      BF16 blocks all-gathered and F32 gradients reduce-scattered, x (n-1)/n
//   pipeline bubble   with P stages and m microbatches the 1F1B schedule idles (P-1)/(m+P-1) of
//                     the step: bubble = compute x (P-1)/m
// The link of a group is NVLink when the group fits in one node, else the network adapter (a ring
// across nodes runs at its slowest link). Nothing overlaps in the model: the trainer runs its
// collectives on the compute stream (the step is one sequence of kernels).
#pragma once

#include <string>
#include <vector>

#include "moe/perf/hardware_profile.h"
#include "moe/train/config.h"
#include "moe/train/step_work.h"

namespace moe {

// Where the ranks run: `gpus` in `nodes` nodes (gpus / nodes per node), and their layout.
struct Topology {
  int64_t gpus = 1;
  int64_t nodes = 1;
  RankLayout layout;  // world == gpus
  int64_t gpus_per_node() const { return gpus / nodes; }
};

struct PredictedPart {
  std::string name;     // "expert GEMMs", ...
  double seconds = 0;   // per step
  double work = 0;      // FLOPs or bytes per step
  const char* unit = "";  // "FLOP" or "B"
  double efficiency = 0;  // the profile's fraction used (0: not applicable)
};

struct StepPrediction {
  std::vector<PredictedPart> parts;  // every part, zero or not, in the order of the split
  double step_s = 0;
  double tokens_per_s_per_gpu = 0;
  double mfu = 0;                    // flops_per_token (the MFU convention) x tokens/s / peak BF16
  StepWork work;
  std::string caveat;                // a setting the model does not time, printed under the split ("" = none)
};

// Checks the topology against the hardware (nodes divide the GPUs, at most gpus_per_node per node,
// an EP group inside one node); throws naming what to change.
void check_topology(const Topology& topo, const HardwareProfile& hw);

StepPrediction predict_step(const Config& cfg, const Topology& topo, const HardwareProfile& hw);

// The split as a table with tokens/s per GPU and MFU.
std::string format_prediction(const StepPrediction& p, const HardwareProfile& hw);

}  // namespace moe

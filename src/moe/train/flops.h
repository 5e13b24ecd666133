// FLOP accounting for MFU (the Megatron/PaLM convention):
//   useful FLOPs per token = 6 x (attention projections + router + K routed experts + shared
//   expert + dense MLPs + LM head, counted as multiply-accumulate parameter counts)
//                          + 12 x layers x seq_len x d_model   (attention scores, full square).
// Recompute is not counted. Embedding lookups and norms are not matrix products and are left out.
// MFU = flops_per_token x tokens/s / (devices x peak), the peak being run.peak_tflops or the
// device's default (the dense BF16 peak of an SXM Hopper GPU; a nominal figure on the CPU).
#pragma once

#include <cstdint>
#include <string>

#include "moe/core/tensor.h"
#include "moe/model/config.h"

namespace moe {

struct FlopCount {
  double matmul_params_per_token = 0;  // parameters used in matrix products by one token
  double expert_params_per_token = 0;  // of which in the K routed experts (all MoE layers)
  double attention_flops_per_token = 0;  // 12 x layers x seq_len x d_q (in flops_per_token)
  double flops_per_token = 0;          // the MFU numerator per trained token
  double total_params = 0;             // every parameter of the model
  double active_params = 0;            // parameters one token touches (K of N experts)
};

FlopCount count_flops(const ModelConfig& cfg, int64_t seq_len);

// The MFU denominator in TFLOP/s per device and where it comes from (for the start-up printout).
struct MfuPeak {
  double tflops = 0;
  std::string source;
};
// configured_tflops > 0 (run.peak_tflops) wins; otherwise the device's default. Throws for a GPU
// without a known default, asking for run.peak_tflops.
MfuPeak mfu_peak(double configured_tflops, Device device);

// Model FLOPs utilization of `devices` devices at `peak` TFLOP/s each.
inline double mfu(const FlopCount& f, double tokens_per_s, const MfuPeak& peak, double devices) {
  return f.flops_per_token * tokens_per_s / (peak.tflops * 1e12 * devices);
}

}  // namespace moe

// FLOP accounting for MFU (DESIGN.md section 9, the Megatron/PaLM convention):
//   useful FLOPs per token = 6 x (attention projections + router + K routed experts + shared
//   expert + dense MLPs + LM head, counted as multiply-accumulate parameter counts)
//                          + 12 x layers x seq_len x d_model   (attention scores, full square).
// Recompute is not counted. Embedding lookups and norms are not matrix products and are left out.
#pragma once

#include <cstdint>

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

}  // namespace moe

// The model's parameters by role: registration under Hugging Face OLMoE names, views into a
// flat buffer (the same struct serves weights and gradients), and initialization.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/model/config.h"
#include "moe/model/params.h"

namespace moe {

struct LayerWeights {
  Tensor input_norm, q_proj, k_proj, v_proj, o_proj;
  Tensor q_norm, k_norm;  // empty when qk_norm = none
  Tensor post_norm;
  // MoE layers
  Tensor router;             // mlp.gate.weight [N, D]
  Tensor experts_gate_up;    // mlp.experts.gate_up_proj [E_local, 2H, D]
  Tensor experts_down;       // mlp.experts.down_proj    [E_local, D, H]
  Tensor shared_gate_up;     // mlp.shared_expert.{gate,up}_proj fused [2S, D]; empty without a shared expert
  Tensor shared_down;        // mlp.shared_expert.down_proj [D, S]
  // Dense layers (the first first_k_dense_replace layers)
  Tensor mlp_gate_up;        // mlp.{gate,up}_proj fused [2Hd, D]
  Tensor mlp_down;           // mlp.down_proj [D, Hd]
};

struct ModelWeights {
  Tensor embed;       // model.embed_tokens.weight [V, D]
  Tensor final_norm;  // model.norm.weight [D]
  Tensor lm_head;     // lm_head.weight [V, D]
  std::vector<LayerWeights> layers;
};

// Registers every parameter of the model. This rank holds experts
// [expert_begin, expert_begin + local_experts) of every MoE layer (EP = 1: all of them).
ParamRegistry build_registry(const ModelConfig& cfg, int64_t expert_begin, int64_t local_experts);

// Views of every parameter inside `flat` (laid out by `reg`).
ModelWeights bind_weights(const ModelConfig& cfg, const ParamRegistry& reg, const Tensor& flat);

// Matrices ~ N(0, init_std^2), norm weights = 1. Each element is a pure function of
// (seed, parameter name, logical index), so every topology initializes the same model.
void init_params(const ModelConfig& cfg, const ParamRegistry& reg, const Tensor& flat, uint64_t seed);

}  // namespace moe

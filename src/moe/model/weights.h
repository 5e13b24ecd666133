// The model's parameters by role: registration under Hugging Face OLMoE names, views into a
// flat buffer (the same struct serves weights and gradients), and initialization.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
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

// How parameters are ordered in the flat buffers.
enum class ParamLayout {
  ByReplicaGroup,  // [dense | expert]: each replica group one contiguous region (DDP + EP)
  ByBlock,         // embedding, layer 0, ..., layer L-1, final norm + LM head: each block contiguous (FSDP)
};

// Registers every parameter of the model. This rank holds experts
// [expert_begin, expert_begin + local_experts) of every MoE layer (EP = 1: all of them).
// held_blocks (indexed like param_block; empty = all): the blocks of a pipeline rank's chunks; the
// parameters of the other blocks are not registered.
ParamRegistry build_registry(const ModelConfig& cfg, int64_t expert_begin, int64_t local_experts,
                             ParamLayout layout = ParamLayout::ByReplicaGroup,
                             const std::vector<bool>& held_blocks = {});

// Views of every parameter inside `flat` (laid out by `reg`); the parameters of blocks the registry
// does not hold are empty tensors.
ModelWeights bind_weights(const ModelConfig& cfg, const ParamRegistry& reg, const Tensor& flat);
// Views given by a function of the parameter's registry index (e.g. into a gather buffer).
using ParamView = std::function<Tensor(int index)>;
ModelWeights bind_weights(const ModelConfig& cfg, const ParamRegistry& reg, const ParamView& view);

// The block a parameter belongs to: 0 = embedding, 1 + l = layer l, L + 1 = final norm and LM head.
int param_block(const ModelConfig& cfg, const std::string& name);

// Matrices ~ N(0, init_std^2), norm weights = 1. Each element is a pure function of
// (seed, parameter name, logical index), so every topology initializes the same model.
void init_params(const ModelConfig& cfg, const ParamRegistry& reg, const Tensor& flat, uint64_t seed);
// The same for parameter i alone, written into `out` (its local shape).
void init_param(const ModelConfig& cfg, const ParamRegistry& reg, int i, const Tensor& out, uint64_t seed);
// Elements [begin, end) of parameter i's local tensor (the same values init_param writes there)
// into out[0, end - begin), host memory: a rank that holds a piece of a tensor (FSDP shards)
// initializes only that piece.
void init_param_range(const ModelConfig& cfg, const ParamRegistry& reg, int i, int64_t begin, int64_t end, float* out,
                      uint64_t seed);

}  // namespace moe

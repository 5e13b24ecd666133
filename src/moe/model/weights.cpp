#include "moe/model/weights.h"

#include "moe/core/device.h"

#include <string>

#include "moe/core/rng.h"

namespace moe {
namespace {

std::string layer_prefix(int64_t l) { return "model.layers." + std::to_string(l) + "."; }

}  // namespace

ParamRegistry build_registry(const ModelConfig& cfg, int64_t expert_begin, int64_t local_experts,
                             ParamLayout layout, const std::vector<bool>& held_blocks) {
  ParamRegistry reg;
  const int64_t blocks = cfg.num_hidden_layers + 2;
  MOE_CHECK(held_blocks.empty() || static_cast<int64_t>(held_blocks.size()) == blocks, "build_registry: ",
            held_blocks.size(), " held-block flags for ", blocks, " blocks");
  auto held = [&](int64_t block) { return held_blocks.empty() || held_blocks[block]; };
  const int64_t D = cfg.hidden_size, hd = cfg.head_dim();
  const int64_t q_out = cfg.num_attention_heads * hd, kv_out = cfg.num_key_value_heads * hd;
  const auto dense = ReplicaGroup::Dense;
  auto add_experts = [&](int64_t l) {
    const std::string p = layer_prefix(l);
    const int64_t N = cfg.num_experts, H = cfg.intermediate_size;
    reg.add_sliced(p + "mlp.experts.gate_up_proj", {N, 2 * H, D}, expert_begin, local_experts, ReplicaGroup::Expert,
                   true);
    reg.add_sliced(p + "mlp.experts.down_proj", {N, D, H}, expert_begin, local_experts, ReplicaGroup::Expert, true);
  };
  if (held(0)) reg.add("model.embed_tokens.weight", {cfg.vocab_size, D}, dense, true);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    if (!held(l + 1)) continue;
    const std::string p = layer_prefix(l);
    reg.add(p + "input_layernorm.weight", {D}, dense, false);
    reg.add(p + "self_attn.q_proj.weight", {q_out, D}, dense, true);
    reg.add(p + "self_attn.k_proj.weight", {kv_out, D}, dense, true);
    reg.add(p + "self_attn.v_proj.weight", {kv_out, D}, dense, true);
    reg.add(p + "self_attn.o_proj.weight", {D, q_out}, dense, true);
    if (cfg.qk_norm == QkNorm::Full) {
      reg.add(p + "self_attn.q_norm.weight", {q_out}, dense, false);
      reg.add(p + "self_attn.k_norm.weight", {kv_out}, dense, false);
    } else if (cfg.qk_norm == QkNorm::PerHead) {
      reg.add(p + "self_attn.q_norm.weight", {hd}, dense, false);
      reg.add(p + "self_attn.k_norm.weight", {hd}, dense, false);
    }
    reg.add(p + "post_attention_layernorm.weight", {D}, dense, false);
    if (cfg.is_moe_layer(l)) {
      reg.add(p + "mlp.gate.weight", {cfg.num_experts, D}, dense, true);
      if (const int64_t S = cfg.shared_expert_intermediate_size; S > 0) {
        // gate then up, back to back, so they form one fused [2S, D] matrix.
        reg.add(p + "mlp.shared_expert.gate_proj.weight", {S, D}, dense, true);
        reg.add(p + "mlp.shared_expert.up_proj.weight", {S, D}, dense, true);
        reg.add(p + "mlp.shared_expert.down_proj.weight", {D, S}, dense, true);
      }
      if (layout == ParamLayout::ByBlock) add_experts(l);
    } else {
      const int64_t Hd = cfg.dense_intermediate_size;
      reg.add(p + "mlp.gate_proj.weight", {Hd, D}, dense, true);
      reg.add(p + "mlp.up_proj.weight", {Hd, D}, dense, true);
      reg.add(p + "mlp.down_proj.weight", {D, Hd}, dense, true);
    }
  }
  if (held(blocks - 1)) {
    reg.add("model.norm.weight", {D}, dense, false);
    reg.add("lm_head.weight", {cfg.vocab_size, D}, dense, true);
  }
  // ByReplicaGroup: expert parameters last, so the flat buffers are [dense region | expert
  // region], each contiguous and reduced and sharded over its own replica group.
  if (layout == ParamLayout::ByReplicaGroup)
    for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
      if (cfg.is_moe_layer(l) && held(l + 1)) add_experts(l);
  return reg;
}

int param_block(const ModelConfig& cfg, const std::string& name) {
  static const std::string layers = "model.layers.";
  if (name.rfind(layers, 0) == 0) return 1 + std::stoi(name.substr(layers.size()));
  if (name == "model.embed_tokens.weight") return 0;
  return static_cast<int>(cfg.num_hidden_layers) + 1;
}

ModelWeights bind_weights(const ModelConfig& cfg, const ParamRegistry& reg, const Tensor& flat) {
  return bind_weights(cfg, reg, [&](int i) { return reg.view(flat, i); });
}

// gate_proj and up_proj, registered back to back, as one fused [2S, D] matrix of their dtype (F32
// weights and gradients, or the GPU's BF16 compute copy).
static Tensor fused_pair(const Tensor& first, const Tensor& second) {
  MOE_CHECK(static_cast<const char*>(first.data) + first.nbytes() == second.data && first.shape == second.shape &&
                first.dtype == second.dtype,
            "fused gate/up view: the two projections are not adjacent in memory");
  return Tensor(first.data, first.dtype, {2 * first.dim(0), first.dim(1)}, first.device);
}

ModelWeights bind_weights(const ModelConfig& cfg, const ParamRegistry& reg, const ParamView& view) {
  auto get = [&](const std::string& name) { return view(reg.index(name)); };
  auto get_if_held = [&](const std::string& name) { return reg.has(name) ? get(name) : Tensor(); };
  ModelWeights w;
  w.embed = get_if_held("model.embed_tokens.weight");
  w.final_norm = get_if_held("model.norm.weight");
  w.lm_head = get_if_held("lm_head.weight");
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l);
    LayerWeights lw;
    if (!reg.has(p + "input_layernorm.weight")) {  // another pipeline stage's layer
      w.layers.push_back(lw);
      continue;
    }
    lw.input_norm = get(p + "input_layernorm.weight");
    lw.q_proj = get(p + "self_attn.q_proj.weight");
    lw.k_proj = get(p + "self_attn.k_proj.weight");
    lw.v_proj = get(p + "self_attn.v_proj.weight");
    lw.o_proj = get(p + "self_attn.o_proj.weight");
    if (cfg.qk_norm != QkNorm::None) {
      lw.q_norm = get(p + "self_attn.q_norm.weight");
      lw.k_norm = get(p + "self_attn.k_norm.weight");
    }
    lw.post_norm = get(p + "post_attention_layernorm.weight");
    if (cfg.is_moe_layer(l)) {
      lw.router = get(p + "mlp.gate.weight");
      lw.experts_gate_up = get(p + "mlp.experts.gate_up_proj");
      lw.experts_down = get(p + "mlp.experts.down_proj");
      if (cfg.shared_expert_intermediate_size > 0) {
        lw.shared_gate_up =
            fused_pair(get(p + "mlp.shared_expert.gate_proj.weight"), get(p + "mlp.shared_expert.up_proj.weight"));
        lw.shared_down = get(p + "mlp.shared_expert.down_proj.weight");
      }
    } else {
      lw.mlp_gate_up = fused_pair(get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight"));
      lw.mlp_down = get(p + "mlp.down_proj.weight");
    }
    w.layers.push_back(lw);
  }
  return w;
}

void init_params(const ModelConfig& cfg, const ParamRegistry& reg, const Tensor& flat, uint64_t seed) {
  std::vector<float> staging;  // device buffers: one parameter at a time through host memory
  for (int i = 0; i < static_cast<int>(reg.entries().size()); ++i) {
    const Tensor dst = reg.view(flat, i);
    if (dst.device == Device::CPU) {
      init_param(cfg, reg, i, dst, seed);
      continue;
    }
    staging.resize(static_cast<size_t>(dst.numel()));
    init_param(cfg, reg, i, Tensor(staging.data(), DType::F32, dst.shape), seed);
    copy_to_tensor(dst, staging.data());
  }
}

void init_param(const ModelConfig& cfg, const ParamRegistry& reg, int i, const Tensor& out, uint64_t seed) {
  init_param_range(cfg, reg, i, 0, reg.entry(i).numel(), out.f32(), seed);
}

void init_param_range(const ModelConfig& cfg, const ParamRegistry& reg, int i, int64_t begin, int64_t end, float* p,
                      uint64_t seed) {
  const ParamEntry& e = reg.entry(i);
  MOE_CHECK(0 <= begin && begin <= end && end <= e.numel(), "init_param_range: [", begin, ", ", end,
            ") outside parameter '", e.name, "' of ", e.numel(), " elements");
  const int64_t n = end - begin;
  if (!e.decay) {  // norm weights
    for (int64_t j = 0; j < n; ++j) p[j] = 1.0f;
    return;
  }
  // Each value is a function of (seed, name, logical index) only: any piece, any rank, same values.
  const uint64_t name_hash = hash_string(e.name);
  const int64_t base = e.global_begin() + begin;
  const double std = cfg.init_std;
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n; ++j) {
    Rng rng(hash_counters(seed, name_hash, static_cast<uint64_t>(base + j)));
    p[j] = static_cast<float>(std * rng.normal());
  }
}

}  // namespace moe

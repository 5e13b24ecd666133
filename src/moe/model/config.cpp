#include "moe/model/config.h"

#include <cmath>
#include <utility>

#include "moe/core/error.h"

namespace moe {

void ModelConfig::validate() const {
  for (const auto& [key, v] :
       {std::pair<const char*, double>{"model.rope_theta", rope_theta}, {"model.rms_norm_eps", rms_norm_eps},
        {"model.router_aux_loss_coef", router_aux_loss_coef}, {"model.router_z_loss_coef", router_z_loss_coef},
        {"model.bias_update_rate", bias_update_rate}, {"model.capacity_factor", capacity_factor},
        {"model.init_std", init_std}})
    MOE_CHECK(std::isfinite(v), key, " must be a finite number, got ", v);
  MOE_CHECK(router_aux_loss_coef >= 0 && router_z_loss_coef >= 0 && bias_update_rate >= 0,
            "model.router_aux_loss_coef, model.router_z_loss_coef and model.bias_update_rate must be >= 0");
  MOE_CHECK(vocab_size > 1, "model.vocab_size must be > 1, got ", vocab_size);
  MOE_CHECK(hidden_size > 0, "model.hidden_size must be > 0, got ", hidden_size);
  MOE_CHECK(num_hidden_layers > 0, "model.num_hidden_layers must be > 0, got ", num_hidden_layers);
  MOE_CHECK(num_attention_heads > 0 && hidden_size % num_attention_heads == 0, "model.num_attention_heads (",
            num_attention_heads, ") must divide model.hidden_size (", hidden_size, ")");
  MOE_CHECK(head_dim() % 2 == 0, "head dim model.hidden_size / model.num_attention_heads = ", head_dim(),
            " must be even for rotary embeddings");
  MOE_CHECK(num_key_value_heads > 0 && num_attention_heads % num_key_value_heads == 0,
            "model.num_key_value_heads (", num_key_value_heads, ") must divide model.num_attention_heads (",
            num_attention_heads, ")");
  MOE_CHECK(first_k_dense_replace >= 0 && first_k_dense_replace <= num_hidden_layers,
            "model.first_k_dense_replace (", first_k_dense_replace, ") must be in [0, model.num_hidden_layers]");
  // A width may be 0 where no layer uses it, and only there (the key table, config_keys.h, says when).
  MOE_CHECK(dense_intermediate_size != 0 || first_k_dense_replace == 0,
            "model.dense_intermediate_size = 0 needs no layer dense (model.first_k_dense_replace = 0), but "
            "model.first_k_dense_replace = ",
            first_k_dense_replace, ": give the hidden size of the dense MLPs");
  MOE_CHECK(intermediate_size != 0 || first_k_dense_replace == num_hidden_layers,
            "model.intermediate_size = 0 needs every layer dense (model.first_k_dense_replace = "
            "model.num_hidden_layers = ",
            num_hidden_layers, "), but model.first_k_dense_replace = ", first_k_dense_replace,
            ": give the experts' hidden size, or make every layer dense");
  if (first_k_dense_replace > 0)
    MOE_CHECK(dense_intermediate_size > 0, "model.dense_intermediate_size must be > 0 when model.first_k_dense_replace > 0");
  // Even an all-dense model (first_k_dense_replace = num_hidden_layers) builds the expert
  // dispatcher, which needs an expert count to split and sizes its buffers by top-K (the keys'
  // ranges say so first).
  MOE_CHECK(num_experts > 0, "model.num_experts must be > 0, got ", num_experts);
  MOE_CHECK(num_experts_per_tok > 0, "model.num_experts_per_tok must be >= 1, got ", num_experts_per_tok,
            " (every model builds the expert dispatcher, which sizes its buffers by it)");
  if (first_k_dense_replace < num_hidden_layers) {
    MOE_CHECK(num_experts_per_tok > 0 && num_experts_per_tok <= num_experts, "model.num_experts_per_tok (",
              num_experts_per_tok, ") must be in [1, model.num_experts = ", num_experts, "]");
    MOE_CHECK(intermediate_size > 0, "model.intermediate_size must be > 0, got ", intermediate_size);
  }
  MOE_CHECK(shared_expert_intermediate_size >= 0, "model.shared_expert_intermediate_size must be >= 0");
  MOE_CHECK(capacity_factor > 0, "model.capacity_factor must be > 0, got ", capacity_factor);
  MOE_CHECK(rms_norm_eps > 0, "model.rms_norm_eps must be > 0");
  MOE_CHECK(rope_theta > 0, "model.rope_theta must be > 0");
  MOE_CHECK(init_std > 0, "model.init_std must be > 0");
  MOE_CHECK(eos_token_id >= 0 && eos_token_id < vocab_size, "model.eos_token_id (", eos_token_id,
            ") must be in [0, model.vocab_size = ", vocab_size, ")");
}

const char* to_string(QkNorm v) {
  switch (v) {
    case QkNorm::None: return "none";
    case QkNorm::Full: return "full";
    case QkNorm::PerHead: return "per_head";
  }
  return "?";
}
const char* to_string(Routing v) {
  switch (v) {
    case Routing::Learned: return "learned";
    case Routing::Random: return "random";
    case Routing::Uniform: return "uniform";
  }
  return "?";
}
const char* to_string(ScoreFn v) { return v == ScoreFn::Softmax ? "softmax" : "sigmoid"; }

}  // namespace moe

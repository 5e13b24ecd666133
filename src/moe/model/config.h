// Model configuration: the OLMoE family. Keys follow Hugging Face OlmoeConfig names where one
// exists (model.vocab_size, model.hidden_size, ...); the rest are moetrain options.
#pragma once

#include <cstdint>
#include <string>

#include "moe/ops/router.h"

namespace moe {

enum class QkNorm { None, Full, PerHead };      // full = over the whole projection (OLMoE)
enum class Routing { Learned, Random, Uniform };  // random/uniform: benchmark routings

struct ModelConfig {
  int64_t vocab_size = 512;
  int64_t hidden_size = 64;           // d_model
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 4;    // < num_attention_heads: grouped-query attention
  int64_t intermediate_size = 128;    // expert hidden size H
  int64_t num_experts = 8;            // N
  int64_t num_experts_per_tok = 2;    // K
  bool norm_topk_prob = false;        // L1-normalize the selected weights (OLMoE: false)
  ScoreFn router_score = ScoreFn::Softmax;
  QkNorm qk_norm = QkNorm::Full;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  int64_t shared_expert_intermediate_size = 0;  // 0 = no shared expert
  int64_t first_k_dense_replace = 0;            // the first k layers use a dense SwiGLU MLP
  int64_t dense_intermediate_size = 0;          // hidden size of those dense MLPs
  double router_aux_loss_coef = 0.01;           // load-balancing loss coefficient
  double router_z_loss_coef = 0.001;            // z-loss coefficient
  Routing routing = Routing::Learned;
  double bias_update_rate = 0.0;   // > 0: auxiliary-loss-free balancing bias, sign update per step
  double capacity_factor = 1.25;   // rank_capacity = ceil(capacity_factor * T * K)
  bool dropless = false;           // capacity sized for the worst case instead
  double init_std = 0.02;
  int64_t eos_token_id = 511;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  bool is_moe_layer(int64_t layer) const { return layer >= first_k_dense_replace; }
  // Throws moe::Error naming the offending keys when the shapes are inconsistent.
  void validate() const;
};

const char* to_string(QkNorm v);
const char* to_string(Routing v);
const char* to_string(ScoreFn v);

}  // namespace moe

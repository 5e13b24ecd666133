// Hugging Face OlmoeConfig (config.json) <-> ModelConfig.
//
// Reading is strict: every key of config.json is read, checked to hold the one value moetrain
// implements (tie_word_embeddings = false, plain RoPE, ...), or known to leave the weights and
// the trained computation unchanged (transformers_version, use_cache, ...). Any other key, a
// value of the wrong type, or a size out of range is refused naming the file and the key, so
// no setting is silently dropped and no size product can overflow.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "moe/model/config.h"

namespace moe {

// The largest size (vocab_size, hidden_size, num_experts, ...) config.json may give. Every
// tensor dimension import-hf derives is at most twice a size, so it fits in int64.
constexpr int64_t kHfMaxSize = 2147483647;

// config.json for OlmoeForCausalLM. Throws naming the keys when the model is not expressible
// as OLMoE (shared expert, dense layers, sigmoid router, QK-norm other than full).
nlohmann::json olmoe_hf_config(const ModelConfig& cfg);

// The inverse. `source` is the path of config.json, named in every error.
ModelConfig model_config_from_hf(const nlohmann::json& hf_config, const std::string& source);

}  // namespace moe

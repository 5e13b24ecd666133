// Hugging Face OLMoE interop (DESIGN.md section 8): export a moetrain checkpoint as a directory
// that transformers loads with OlmoeForCausalLM.from_pretrained, and import such a directory
// (per-expert Hub layout or the fused transformers-5 layout) as a moetrain checkpoint.
// Both stream one logical tensor (for experts: one expert) at a time through host memory.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "moe/model/config.h"

namespace moe {

// config.json for OlmoeForCausalLM. Throws naming the keys when the model is not expressible
// as OLMoE (shared expert, dense layers, sigmoid router, QK-norm other than full).
nlohmann::json olmoe_hf_config(const ModelConfig& cfg);
// The inverse: reads OlmoeConfig keys (rope_theta or rope_parameters.rope_theta).
ModelConfig model_config_from_hf(const nlohmann::json& hf_config);

struct ExportResult {
  std::string out_dir;
  int shards = 0;
  int64_t tensors = 0;
  int64_t bytes = 0;
  size_t peak_rss_bytes = 0;
};
// Writes config.json, model-0000i-of-0000n.safetensors (F32, per-expert tensors) and
// model.safetensors.index.json into out_dir (via a temporary directory renamed at the end);
// optional tokenizer files are copied in. max_shard_bytes bounds each shard.
ExportResult export_hf(const std::string& checkpoint, const std::string& out_dir, int64_t max_shard_bytes,
                       const std::vector<std::string>& tokenizer_files = {});

struct ImportResult {
  std::string checkpoint_dir;  // <out>/step-000000
  std::string config_path;     // <out>/config.toml (the model from config.json, the rest defaults)
  int64_t tensors = 0;
  bool fused_experts = false;  // the source stored experts fused ([N, 2H, D]) rather than per expert
};
// Reads <hf_dir>/config.json and its safetensors (model.safetensors or the sharded index) and
// writes a moetrain checkpoint at step 0 with fresh (zero) AdamW moments.
ImportResult import_hf(const std::string& hf_dir, const std::string& out_run_dir);

}  // namespace moe

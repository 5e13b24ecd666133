// Small Hugging Face OLMoE folders for the import-hf tests: config.json as OlmoeConfig writes it
// and tensors with distinct values, in one model.safetensors or in shards with an index, F32 or
// BF16, per-expert (Hub) or fused (transformers 5) experts. Tests change one thing in a folder
// this writes; the positive controls import the unchanged folder.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "moe/ckpt/safetensors.h"
#include "moe/core/dtype.h"

namespace hf_testing {

struct HfSpec {  // grouped-query attention, so both head counts show in the shapes
  int64_t vocab = 64, hidden = 16, intermediate = 8, layers = 2, heads = 4, kv_heads = 2, experts = 4, top_k = 2;
  bool fused = false;  // experts as [N, 2H, D] gate_up_proj and [N, D, H] down_proj
};

// config.json of OLMoE-1B-7B-0924 (its keys and their types), with the sizes of `s`.
inline nlohmann::json olmoe_config(const HfSpec& s) {
  return {{"architectures", {"OlmoeForCausalLM"}},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"clip_qkv", nullptr},
          {"eos_token_id", s.vocab - 1},
          {"hidden_act", "silu"},
          {"hidden_size", s.hidden},
          {"initializer_range", 0.02},
          {"intermediate_size", s.intermediate},
          {"max_position_embeddings", 4096},
          {"model_type", "olmoe"},
          {"norm_topk_prob", false},
          {"num_attention_heads", s.heads},
          {"num_experts", s.experts},
          {"num_experts_per_tok", s.top_k},
          {"num_hidden_layers", s.layers},
          {"num_key_value_heads", s.kv_heads},
          {"output_router_logits", false},
          {"pad_token_id", 1},
          {"rms_norm_eps", 1e-05},
          {"rope_scaling", nullptr},
          {"rope_theta", 10000.0},
          {"router_aux_loss_coef", 0.01},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"},
          {"transformers_version", "4.43.0.dev0"},
          {"use_cache", true},
          {"vocab_size", s.vocab}};
}

struct HfTensorData {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Values that differ between tensors and between elements (so a misplaced expert or row shows),
// small enough to train from, and exact in BF16 (multiples of 1/64 below 1).
inline std::vector<float> pattern(size_t seed, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int>((seed * 31 + i * 7) % 61) - 30) / 64;
  return v;
}

inline std::vector<HfTensorData> olmoe_tensors(const HfSpec& s) {
  const int64_t D = s.hidden, H = s.intermediate, N = s.experts, hd = s.hidden / s.heads;
  std::vector<HfTensorData> t;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    t.push_back({name, std::move(shape), pattern(t.size(), n)});
  };
  add("model.embed_tokens.weight", {s.vocab, D});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {D});
    add(p + "self_attn.q_proj.weight", {s.heads * hd, D});
    add(p + "self_attn.k_proj.weight", {s.kv_heads * hd, D});
    add(p + "self_attn.v_proj.weight", {s.kv_heads * hd, D});
    add(p + "self_attn.o_proj.weight", {D, s.heads * hd});
    add(p + "self_attn.q_norm.weight", {s.heads * hd});
    add(p + "self_attn.k_norm.weight", {s.kv_heads * hd});
    add(p + "post_attention_layernorm.weight", {D});
    add(p + "mlp.gate.weight", {N, D});
    if (s.fused) {
      add(p + "mlp.experts.gate_up_proj", {N, 2 * H, D});
      add(p + "mlp.experts.down_proj", {N, D, H});
      continue;
    }
    for (int64_t x = 0; x < N; ++x) {
      const std::string e = p + "mlp.experts." + std::to_string(x) + ".";
      add(e + "gate_proj.weight", {H, D});
      add(e + "up_proj.weight", {H, D});
      add(e + "down_proj.weight", {D, H});
    }
  }
  add("model.norm.weight", {D});
  add("lm_head.weight", {s.vocab, D});
  return t;
}

inline const HfTensorData& find_tensor(const std::vector<HfTensorData>& tensors, const std::string& name) {
  for (const HfTensorData& t : tensors)
    if (t.name == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return tensors.front();
}

inline void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// A safetensors file holding `tensors` as `dtype` (F32 or BF16).
inline void write_shard(const std::string& path, const std::vector<HfTensorData>& tensors, moe::DType dtype) {
  std::vector<std::vector<uint16_t>> bf16(tensors.size());
  std::vector<std::tuple<std::string, moe::DType, std::vector<int64_t>, const void*>> entries;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const void* data = tensors[i].values.data();
    if (dtype == moe::DType::BF16) {
      for (float v : tensors[i].values) bf16[i].push_back(moe::f32_to_bf16(v));
      data = bf16[i].data();
    }
    entries.emplace_back(tensors[i].name, dtype, tensors[i].shape, data);
  }
  moe::write_safetensors(path, entries, {{"format", "pt"}});
}

// Writes config.json and the tensors into dir (created): shards == 0 gives one
// model.safetensors; shards > 0 gives model-0000i-of-0000n.safetensors, consecutive tensors in
// each, and model.safetensors.index.json.
inline void write_hf_folder(const std::string& dir, const nlohmann::json& config,
                            const std::vector<HfTensorData>& tensors, int shards = 0,
                            moe::DType dtype = moe::DType::F32) {
  std::filesystem::create_directories(dir);
  write_json(dir + "/config.json", config);
  if (shards == 0) {
    write_shard(dir + "/model.safetensors", tensors, dtype);
    return;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  const size_t per_shard = (tensors.size() + shards - 1) / shards;
  for (int s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", s + 1, shards);
    const size_t begin = s * per_shard, end = std::min(tensors.size(), begin + per_shard);
    const std::vector<HfTensorData> part(tensors.begin() + static_cast<long>(begin),
                                         tensors.begin() + static_cast<long>(end));
    write_shard(dir + "/" + name, part, dtype);
    for (const HfTensorData& t : part) weight_map[t.name] = name;
  }
  write_json(dir + "/model.safetensors.index.json", {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}});
}

// Every file and folder under dir (relative paths, sorted), to show that a failed import
// left a folder exactly as it was.
inline std::vector<std::string> tree(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) return names;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    names.push_back(std::filesystem::relative(e.path(), dir).string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace hf_testing

using namespace hf_testing;  // NOLINT: test helpers

// config.json -> ModelConfig (model_config_from_hf): the published OLMoE configs read with
// their values (the positive controls); every other value of every key is either read exactly
// or refused with config.json's path and the key in the message, never converted or dropped.
#include "moe/train/hf_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/core/error.h"

namespace {

using nlohmann::json;
const std::string kSource = "/models/olmoe/config.json";

// config.json of allenai/OLMoE-1B-7B-0924 as published on the Hub.
const char* kOlmoe0924 = R"({
  "architectures": ["OlmoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "clip_qkv": null,
  "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 1024, "max_position_embeddings": 4096, "model_type": "olmoe", "norm_topk_prob": false,
  "num_attention_heads": 16, "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16,
  "num_key_value_heads": 16, "output_router_logits": false, "pad_token_id": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "rope_theta": 10000.0, "router_aux_loss_coef": 0.01, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 50304})";

json base() { return json::parse(kOlmoe0924); }

// The error message of reading `j`, or "" when it reads.
std::string error_of(const json& j) {
  try {
    moe::model_config_from_hf(j, kSource);
  } catch (const moe::Error& e) {
    return e.what();
  }
  return "";
}

void expect_refused(const json& j, const std::vector<std::string>& needles) {
  const std::string err = error_of(j);
  ASSERT_NE(err, "") << "accepted: " << j.dump();
  EXPECT_NE(err.find(kSource), std::string::npos) << err;
  for (const std::string& n : needles) EXPECT_NE(err.find(n), std::string::npos) << "lacks '" << n << "': " << err;
}

TEST(HfConfig, olmoe_1b_7b_0924_config_reads_with_its_values) {
  const moe::ModelConfig c = moe::model_config_from_hf(base(), kSource);
  EXPECT_EQ(c.vocab_size, 50304);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 1024);
  EXPECT_EQ(c.num_hidden_layers, 16);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 16);
  EXPECT_EQ(c.num_experts, 64);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.router_aux_loss_coef, 0.01);
  EXPECT_EQ(c.init_std, 0.02);
  EXPECT_EQ(c.eos_token_id, 50279);
}

TEST(HfConfig, transformers_5_rope_parameters_and_private_keys_read) {
  json j = base();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  j["dtype"] = "bfloat16";
  j["_name_or_path"] = "allenai/OLMoE-1B-7B-0924";
  EXPECT_EQ(moe::model_config_from_hf(j, kSource).rope_theta, 500000.0);
  j["rope_theta"] = 500000.0;  // both forms, agreeing
  EXPECT_EQ(moe::model_config_from_hf(j, kSource).rope_theta, 500000.0);
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(error_of(j), "");
}

TEST(HfConfig, export_config_reads_back_to_the_same_model) {
  moe::ModelConfig c;
  c.vocab_size = 300, c.hidden_size = 32, c.num_attention_heads = 4, c.num_key_value_heads = 2;
  c.norm_topk_prob = true, c.rope_theta = 123.5, c.eos_token_id = 7;
  const moe::ModelConfig back = moe::model_config_from_hf(moe::olmoe_hf_config(c), kSource);
  EXPECT_EQ(back.vocab_size, 300);
  EXPECT_EQ(back.num_key_value_heads, 2);
  EXPECT_TRUE(back.norm_topk_prob);
  EXPECT_EQ(back.rope_theta, 123.5);
  EXPECT_EQ(back.eos_token_id, 7);
}

TEST(HfConfig, every_size_key_refuses_values_that_are_not_integers_in_range) {
  const std::vector<json> bad = {2.5, "8", true, -3, 1e30, 4294967296LL, json::array({8}), json::object()};
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "num_experts", "num_experts_per_tok", "eos_token_id"}) {
    for (const json& v : bad) {
      SCOPED_TRACE(std::string(key) + " = " + v.dump());
      json j = base();
      j[key] = v;
      expect_refused(j, {std::string("'").append(key).append("' must be an integer"), v.dump()});
    }
  }
  json j = base();
  j["num_experts"] = 0;
  expect_refused(j, {"'num_experts' must be an integer in [1, 2147483647], got 0"});
  j = base();
  j["eos_token_id"] = 0;  // token 0 is a valid EOS
  EXPECT_EQ(error_of(j), "");
}

TEST(HfConfig, every_float_key_refuses_values_that_are_not_numbers) {
  for (const char* key :
       {"rms_norm_eps", "rope_theta", "router_aux_loss_coef", "initializer_range", "attention_dropout"}) {
    for (const json& v : {json("1e-5"), json(true), json(-1.0), json::array({1.0})}) {
      SCOPED_TRACE(std::string(key) + " = " + v.dump());
      json j = base();
      j[key] = v;
      expect_refused(j, {std::string("'").append(key).append("' must be a finite number")});
    }
  }
  json j = base();
  j["rms_norm_eps"] = 0;
  expect_refused(j, {"'rms_norm_eps' must be a finite number > 0"});
  j = base();
  j["norm_topk_prob"] = "false";
  expect_refused(j, {"'norm_topk_prob' must be true or false"});
}

// Values that config.json allows but moetrain's own model.* keys do not: import-hf wrote them
// into a config.toml that `train` then refused (and --init-from could never match them).
TEST(HfConfig, values_outside_the_range_of_moetrains_model_keys_are_refused_naming_the_config_json_key) {
  const std::vector<std::tuple<std::string, json, std::string>> cases = {
      {"rope_theta", 0.5, "model.rope_theta"},
      {"rope_theta", 1e13, "model.rope_theta"},
      {"rms_norm_eps", 2.0, "model.rms_norm_eps"},
      {"initializer_range", 100.0, "model.init_std"},
      {"router_aux_loss_coef", 1e4, "model.router_aux_loss_coef"},
      {"num_hidden_layers", 70000, "model.num_hidden_layers"}};
  for (const auto& [key, value, moetrain_key] : cases) {
    SCOPED_TRACE(key + " = " + value.dump());
    json j = base();
    j[key] = value;
    expect_refused(j, {"'" + key + "' is " + value.dump() + ", outside", moetrain_key});
  }
  json j = base();
  j["rope_theta"] = 1e12;  // the ends of the ranges are in them
  j["rms_norm_eps"] = 1.0;
  EXPECT_EQ(error_of(j), "");
}

TEST(HfConfig, required_size_that_is_absent_or_null_is_named) {
  for (const char* key : {"vocab_size", "hidden_size", "num_experts"}) {
    json j = base();
    j.erase(key);
    expect_refused(j, {std::string("lacks '").append(key).append("'")});
    j[key] = nullptr;  // present, but null: said as such (it read "lacks" before)
    expect_refused(j, {std::string("has null for '").append(key).append("'")});
  }
}

TEST(HfConfig, settings_moetrain_does_not_implement_are_refused_naming_the_key) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"model_type", "llama"},
      {"model_type", nullptr},
      {"architectures", {"LlamaForCausalLM"}},
      {"architectures", {"OlmoeModel"}},
      {"tie_word_embeddings", true},
      {"hidden_act", "gelu"},
      {"attention_bias", true},
      {"clip_qkv", 8.0},
      {"attention_dropout", 0.1},
      {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}},
      {"rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}},
      {"rope_scaling", "yarn"},
      {"rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}}},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5}}},
      {"sliding_window", 4096},
      {"quantization_config", {{"quant_method", "bitsandbytes"}}},
      {"head_dim", 64}};
  for (const auto& [key, value] : cases) {
    SCOPED_TRACE(key + " = " + value.dump());
    json j = base();
    j[key] = value;
    expect_refused(j, {std::string("'").append(key).append("'")});
  }
}

TEST(HfConfig, rope_theta_that_disagrees_with_rope_parameters_is_refused) {
  json j = base();
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  expect_refused(j, {"'rope_theta'", "rope_parameters.rope_theta", "500000"});
}

TEST(HfConfig, sizes_that_do_not_fit_together_are_named_by_their_config_json_keys) {
  const std::vector<std::tuple<std::string, json, std::string>> cases = {
      {"num_attention_heads", 3, "'num_attention_heads' (3) must divide hidden_size (2048)"},
      {"num_key_value_heads", 3, "'num_key_value_heads' (3) must divide num_attention_heads (16)"},
      {"num_experts_per_tok", 65, "'num_experts_per_tok' (65) must be at most num_experts (64)"},
      {"eos_token_id", 50304, "'eos_token_id' (50304) must be below vocab_size (50304)"},
      {"hidden_size", 2064, "head_dim = hidden_size / num_attention_heads = 129"}};
  for (const auto& [key, value, needle] : cases) {
    SCOPED_TRACE(key);
    json j = base();
    j[key] = value;
    expect_refused(j, {needle});
  }
}

TEST(HfConfig, config_that_is_not_an_object_is_refused) { expect_refused(json::array({1, 2}), {"not a JSON object"}); }

}  // namespace

#include "moe/train/hf_config.h"

#include <cmath>
#include <set>
#include <sstream>
#include <type_traits>

#include "moe/core/error.h"
#include "moe/train/config_keys.h"

namespace moe {
namespace {

using nlohmann::json;

// Keys that change neither the weights nor what moetrain trains: bookkeeping, and settings of
// generation or of transformers' own forward (caching, returned outputs, the position limit of
// plain RoPE, token ids other than EOS). Keys starting with '_' are transformers' private
// bookkeeping (_name_or_path, _attn_implementation) and are ignored too.
const std::set<std::string>& ignored_keys() {
  // clang-format off
  static const std::set<std::string> keys = {
      "transformers_version", "torch_dtype", "dtype", "use_cache", "pad_token_id", "bos_token_id",
      "output_router_logits", "max_position_embeddings", "output_attentions", "output_hidden_states",
      "return_dict", "tokenizer_class"};
  // clang-format on
  return keys;
}

// Keys read into the ModelConfig or checked to hold the value moetrain implements.
const std::set<std::string>& handled_keys() {
  // clang-format off
  static const std::set<std::string> keys = {
      "model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
      "num_attention_heads", "num_key_value_heads", "num_experts", "num_experts_per_tok", "norm_topk_prob",
      "rms_norm_eps", "rope_theta", "rope_parameters", "rope_scaling", "router_aux_loss_coef",
      "initializer_range", "eos_token_id", "hidden_act", "tie_word_embeddings", "attention_bias",
      "attention_dropout", "clip_qkv"};
  // clang-format on
  return keys;
}

// Typed access to config.json; every failure names the file and the key.
class HfConfigReader {
 public:
  HfConfigReader(const json& j, const std::string& source) : j_(j), source_(source) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    MOE_FAIL(source_, ": '", key, "' ", what);
  }
  // The value of `key`, or null when it is absent or null (transformers treats both as unset).
  const json* find(const std::string& key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  const json& need(const std::string& key) const {
    const json* v = find(key);
    if (!v) MOE_FAIL(source_, j_.contains(key) ? " has null for '" : " lacks '", key, "', which moetrain needs");
    return *v;
  }
  // An integer in [lo, kHfMaxSize]: 2.5, "8", true, -1 and 1e30 are refused rather than converted.
  int64_t size(const std::string& key, int64_t lo, const json* v) const {
    bool in_range = false;
    if (v->is_number_unsigned())
      in_range =
          v->get<uint64_t>() >= static_cast<uint64_t>(lo) && v->get<uint64_t>() <= static_cast<uint64_t>(kHfMaxSize);
    else if (v->is_number_integer())
      in_range = v->get<int64_t>() >= lo && v->get<int64_t>() <= kHfMaxSize;
    if (!in_range)
      fail(key,
           "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(kHfMaxSize) + "], got " + v->dump());
    return v->get<int64_t>();
  }
  int64_t size(const std::string& key, int64_t lo) const { return size(key, lo, &need(key)); }
  // A finite number (an integer counts) that is > 0, or >= 0 with allow_zero.
  double number(const std::string& key, double fallback, bool allow_zero) const {
    const json* v = find(key);
    if (!v) return fallback;
    const char* range = allow_zero ? "must be a finite number >= 0" : "must be a finite number > 0";
    if (!v->is_number()) fail(key, std::string(range) + ", got " + v->dump());
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < 0 || (x == 0 && !allow_zero)) fail(key, std::string(range) + ", got " + v->dump());
    return x;
  }
  bool flag(const std::string& key, bool fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(key, "must be true or false, got " + v->dump());
    return v->get<bool>();
  }
  // `key` is absent, null or `expected`; other values name a setting moetrain does not implement.
  void require(const std::string& key, const json& expected, const std::string& why) const {
    const json* v = find(key);
    if (v && *v != expected)
      fail(key, "is " + v->dump() + "; " + why + " (moetrain reads only " + expected.dump() + ")");
  }

 private:
  const json& j_;
  const std::string& source_;
};

// RoPE: only the default (unscaled) form. rope_scaling (transformers 4) and rope_parameters
// (transformers 5) may say so explicitly; any scaling is refused rather than dropped, since the
// imported model would then see positions differently from the one that was trained.
double rope_theta_from_hf(const HfConfigReader& r) {
  auto check_default = [&](const std::string& key, const std::set<std::string>& allowed) {
    const json* v = r.find(key);
    if (!v) return;
    if (!v->is_object()) r.fail(key, "must be an object, got " + v->dump());
    for (const auto& [k, value] : v->items()) {
      const bool type_key = k == "rope_type" || k == "type";
      if (type_key && value == "default") continue;
      if (!type_key && allowed.count(k)) continue;
      r.fail(key, "is " + v->dump() + "; moetrain implements plain RoPE only (no '" + k +
                      "' setting), so moetrain refuses rather than change how the model sees positions");
    }
  };
  check_default("rope_scaling", {});
  check_default("rope_parameters", {"rope_theta"});
  const double top = r.number("rope_theta", 10000.0, false);
  const json* params = r.find("rope_parameters");
  if (!params || !params->contains("rope_theta")) return top;
  const json& nested = (*params)["rope_theta"];
  if (!nested.is_number() || !std::isfinite(nested.get<double>()) || nested.get<double>() <= 0)
    r.fail("rope_parameters", "has rope_theta " + nested.dump() + "; it must be a finite number > 0");
  if (r.find("rope_theta") && top != nested.get<double>())
    r.fail("rope_theta",
           "is " + json(top).dump() + " but rope_parameters.rope_theta is " + nested.dump() + "; the two must agree");
  return nested.get<double>();
}

// The values config.json gives must also lie in the ranges of moetrain's own model.* keys
// (config_keys.h): import-hf writes them into a config.toml, which `train` reads with those
// ranges, and a run started from the model has them in its config. Each is named by its
// config.json key; the model keys config.json does not set keep their (valid) defaults.
struct ModelKeyRanges {
  const std::string& source;

  static const char* hf_key(const char* section, const std::string& name) {
    static const std::set<std::string> same_name = {
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "num_experts", "num_experts_per_tok", "rope_theta", "rms_norm_eps",
        "router_aux_loss_coef", "eos_token_id"};
    if (std::string(section) != "model") return nullptr;
    if (name == "init_std") return "initializer_range";
    const auto it = same_name.find(name);
    return it == same_name.end() ? nullptr : it->c_str();
  }
  template <typename T>
  void key(const char* section, const char* name, const T& v, const Range<T>& r, const char*) {
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      const char* hf = hf_key(section, name);
      const bool low = r.lo && (r.lo_open ? !(v > *r.lo) : !(v >= *r.lo));
      const bool high = r.hi && (r.hi_open ? !(v < *r.hi) : !(v <= *r.hi));
      if (!hf || !(low || high)) return;
      std::ostringstream range;  // the ranges of these keys have both ends
      range.precision(6);
      if (r.lo && r.hi) range << (r.lo_open ? "(" : "[") << *r.lo << ", " << *r.hi << (r.hi_open ? ")" : "]");
      MOE_FAIL(source, ": '", hf, "' is ", json(v).dump(), ", outside ", range.str(), ", the range of moetrain's model.",
               name, "; a model with this value could not be trained or resumed by moetrain");
    }
  }
  template <typename E>
  void choice(const char*, const char*, const E&, const Choices<E>&, const char*) {}
  void integer_array(const char*, const char*, const std::vector<int64_t>&, const Range<int64_t>&, const char*) {}
  template <typename E, typename Fields>
  void table_array(const char*, const char*, const std::vector<E>&, const char*, Fields) {}
};

}  // namespace

json olmoe_hf_config(const ModelConfig& c) {
  MOE_CHECK(c.qk_norm == QkNorm::Full,
            "export-hf: OlmoeForCausalLM normalizes the whole q/k projections; model.qk_norm = \"",
            to_string(c.qk_norm), "\" has no OLMoE equivalent");
  MOE_CHECK(c.router_score == ScoreFn::Softmax,
            "export-hf: OLMoE routers use softmax; model.router_score = \"sigmoid\"");
  MOE_CHECK(c.shared_expert_intermediate_size == 0,
            "export-hf: OLMoE has no shared expert (model.shared_expert_intermediate_size = ",
            c.shared_expert_intermediate_size, ")");
  MOE_CHECK(c.first_k_dense_replace == 0,
            "export-hf: OLMoE has no dense layers (model.first_k_dense_replace = ", c.first_k_dense_replace, ")");
  MOE_CHECK(c.bias_update_rate == 0, "export-hf: the model routes with an auxiliary-loss-free selection bias ",
            "(model.bias_update_rate = ", c.bias_update_rate, "), which OlmoeForCausalLM cannot express");
  MOE_CHECK(c.routing == Routing::Learned, "export-hf: the model was trained with model.routing = \"",
            to_string(c.routing), "\" (its router never chose the experts), which OlmoeForCausalLM's learned router "
            "would not reproduce");
  return {{"architectures", {"OlmoeForCausalLM"}},
          {"model_type", "olmoe"},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"hidden_act", "silu"},
          {"max_position_embeddings", 4096},
          {"initializer_range", c.init_std},
          {"rms_norm_eps", c.rms_norm_eps},
          {"use_cache", true},
          {"pad_token_id", nullptr},
          {"bos_token_id", nullptr},
          {"eos_token_id", c.eos_token_id},
          {"tie_word_embeddings", false},
          {"rope_theta", c.rope_theta},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rope_theta}}},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"clip_qkv", nullptr},
          {"num_experts_per_tok", c.num_experts_per_tok},
          {"num_experts", c.num_experts},
          {"output_router_logits", false},
          {"router_aux_loss_coef", c.router_aux_loss_coef},
          {"norm_topk_prob", c.norm_topk_prob},
          {"torch_dtype", "float32"}};
}

ModelConfig model_config_from_hf(const json& j, const std::string& source) {
  MOE_CHECK(j.is_object(), source, " is not a JSON object");
  for (const auto& [key, value] : j.items())
    MOE_CHECK(key.rfind('_', 0) == 0 || ignored_keys().count(key) || handled_keys().count(key), source, ": '", key,
              "' is not an OlmoeConfig setting moetrain knows; it refuses rather than drop a setting that may change "
              "the model");
  const HfConfigReader r(j, source);
  const json& type = r.need("model_type");
  if (type != "olmoe")
    r.fail("model_type", "is " + type.dump() + "; moetrain reads OLMoE models (model_type \"olmoe\")");
  if (const json* arch = r.find("architectures");
      arch && !(arch->is_array() && arch->size() == 1 && (*arch)[0] == "OlmoeForCausalLM"))
    r.fail("architectures", "is " + arch->dump() + "; moetrain reads [\"OlmoeForCausalLM\"] checkpoints");
  r.require("hidden_act", "silu", "the experts of moetrain use SwiGLU");
  r.require("tie_word_embeddings", false, "moetrain keeps the LM head separate from the embedding");
  r.require("attention_bias", false, "moetrain's attention projections have no bias");
  r.require("clip_qkv", nullptr, "moetrain does not clip q/k/v");
  if (r.number("attention_dropout", 0.0, true) != 0) r.fail("attention_dropout", "must be 0; moetrain has no dropout");

  ModelConfig c;
  c.vocab_size = r.size("vocab_size", 2);
  c.hidden_size = r.size("hidden_size", 1);
  c.intermediate_size = r.size("intermediate_size", 1);
  c.num_hidden_layers = r.size("num_hidden_layers", 1);
  c.num_attention_heads = r.size("num_attention_heads", 1);
  const json* kv = r.find("num_key_value_heads");
  c.num_key_value_heads = kv ? r.size("num_key_value_heads", 1, kv) : c.num_attention_heads;
  c.num_experts = r.size("num_experts", 1);
  c.num_experts_per_tok = r.size("num_experts_per_tok", 1);
  c.norm_topk_prob = r.flag("norm_topk_prob", false);
  c.rms_norm_eps = r.number("rms_norm_eps", 1e-5, false);
  c.rope_theta = rope_theta_from_hf(r);
  c.router_aux_loss_coef = r.number("router_aux_loss_coef", 0.01, true);
  c.init_std = r.number("initializer_range", 0.02, false);
  const json* eos = r.find("eos_token_id");
  c.eos_token_id = eos ? r.size("eos_token_id", 0, eos) : c.vocab_size - 1;

  // The relations ModelConfig::validate also checks, here in config.json's own key names.
  if (c.hidden_size % c.num_attention_heads != 0)
    r.fail("num_attention_heads", "(" + std::to_string(c.num_attention_heads) + ") must divide hidden_size (" +
                                      std::to_string(c.hidden_size) + ")");
  if (c.head_dim() % 2 != 0)
    r.fail("num_attention_heads", "gives head_dim = hidden_size / num_attention_heads = " +
                                      std::to_string(c.head_dim()) + ", which must be even for rotary embeddings");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    r.fail("num_key_value_heads", "(" + std::to_string(c.num_key_value_heads) + ") must divide num_attention_heads (" +
                                      std::to_string(c.num_attention_heads) + ")");
  if (c.num_experts_per_tok > c.num_experts)
    r.fail("num_experts_per_tok", "(" + std::to_string(c.num_experts_per_tok) + ") must be at most num_experts (" +
                                      std::to_string(c.num_experts) + ")");
  if (c.eos_token_id >= c.vocab_size)
    r.fail("eos_token_id",
           "(" + std::to_string(c.eos_token_id) + ") must be below vocab_size (" + std::to_string(c.vocab_size) + ")");
  try {
    c.validate();
  } catch (const Error& e) {
    MOE_FAIL(source, " describes a model moetrain cannot build: ", e.what());
  }
  Config whole;
  whole.model = c;
  visit_config_keys(std::as_const(whole), ModelKeyRanges{source});
  return c;
}

}  // namespace moe

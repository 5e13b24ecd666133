#include "moe/train/hf_interop.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>

#include "moe/ckpt/checkpoint.h"
#include "moe/ckpt/run_checkpoints.h"
#include "moe/ckpt/safetensors.h"
#include "moe/core/arena.h"
#include "moe/core/error.h"
#include "moe/model/weights.h"
#include "moe/train/config.h"

namespace fs = std::filesystem;

namespace moe {
namespace {

std::vector<int64_t> dims(const Shape& s) { return std::vector<int64_t>(s.dims.begin(), s.dims.begin() + s.ndim); }

// One tensor of the Hugging Face layout and how to produce its FP32 values.
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::function<void(float* dst)> fill;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Expert tensors are stored fused ([N, 2H, D] gate rows first, [N, D, H]); the Hub layout has
// one gate_proj [H, D], up_proj [H, D] and down_proj [D, H] per expert.
std::vector<HfTensor> hf_tensors(const ModelConfig& mc, const CheckpointReader& ckpt) {
  const ParamRegistry reg = build_registry(mc, 0, mc.num_experts, ParamLayout::ByBlock);
  std::vector<HfTensor> out;
  const std::string fused_gate_up = ".mlp.experts.gate_up_proj", fused_down = ".mlp.experts.down_proj";
  const int64_t D = mc.hidden_size, H = mc.intermediate_size;
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (const ParamEntry& e : reg.entries()) {
    const std::string name = e.name;
    if (ends_with(name, fused_gate_up)) {
      const std::string base = name.substr(0, name.size() - std::string("gate_up_proj").size());
      for (int64_t x = 0; x < mc.num_experts; ++x) {
        const int64_t at = x * 2 * H * D;
        out.push_back({base + std::to_string(x) + ".gate_proj.weight", {H, D},
                       [&ckpt, name, at, H, D](float* dst) { ckpt.read(name, DType::F32, at, at + H * D, dst); }});
        out.push_back({base + std::to_string(x) + ".up_proj.weight", {H, D}, [&ckpt, name, at, H, D](float* dst) {
                         ckpt.read(name, DType::F32, at + H * D, at + 2 * H * D, dst);
                       }});
      }
    } else if (ends_with(name, fused_down)) {
      const std::string base = name.substr(0, name.size() - std::string("down_proj").size());
      for (int64_t x = 0; x < mc.num_experts; ++x) {
        const int64_t at = x * D * H;
        out.push_back({base + std::to_string(x) + ".down_proj.weight", {D, H},
                       [&ckpt, name, at, H, D](float* dst) { ckpt.read(name, DType::F32, at, at + D * H, dst); }});
      }
    } else {
      const int64_t n = e.global_shape.numel();
      out.push_back({name, dims(e.global_shape), [&ckpt, name, n](float* dst) { ckpt.read(name, DType::F32, 0, n, dst); }});
    }
  }
  return out;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  MOE_CHECK(out.good(), "cannot write ", path);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  MOE_CHECK(in.good(), "cannot read ", path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    MOE_FAIL(path, " is not valid JSON: ", e.what());
  }
}

// Widens a stored tensor (F32 or BF16) into FP32.
void to_f32(const SafetensorsReader& f, const std::string& name, const std::vector<int64_t>& shape, float* dst) {
  const SafetensorsEntry& e = f.entry(name);
  MOE_CHECK(e.shape == shape, f.path(), ": tensor '", name, "' has shape ", nlohmann::json(e.shape).dump(),
            ", the config implies ", nlohmann::json(shape).dump());
  const auto* src = static_cast<const unsigned char*>(f.data(name));
  const size_t n = (e.end - e.begin) / dtype_size(e.dtype);
  if (e.dtype == DType::F32) {
    std::memcpy(dst, src, n * 4);
  } else if (e.dtype == DType::BF16) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = bf16_to_f32(h);
    }
  } else {
    MOE_FAIL(f.path(), ": tensor '", name, "' has dtype ", dtype_name(e.dtype), "; import-hf reads F32 and BF16");
  }
}

}  // namespace

nlohmann::json olmoe_hf_config(const ModelConfig& c) {
  MOE_CHECK(c.qk_norm == QkNorm::Full, "export-hf: OlmoeForCausalLM normalizes the whole q/k projections; model.qk_norm = \"",
            to_string(c.qk_norm), "\" has no OLMoE equivalent");
  MOE_CHECK(c.router_score == ScoreFn::Softmax, "export-hf: OLMoE routers use softmax; model.router_score = \"sigmoid\"");
  MOE_CHECK(c.shared_expert_intermediate_size == 0, "export-hf: OLMoE has no shared expert (model.shared_expert_intermediate_size = ",
            c.shared_expert_intermediate_size, ")");
  MOE_CHECK(c.first_k_dense_replace == 0, "export-hf: OLMoE has no dense layers (model.first_k_dense_replace = ",
            c.first_k_dense_replace, ")");
  MOE_CHECK(c.bias_update_rate == 0, "export-hf: the model routes with an auxiliary-loss-free selection bias ",
            "(model.bias_update_rate = ", c.bias_update_rate, "), which OlmoeForCausalLM cannot express");
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

ModelConfig model_config_from_hf(const nlohmann::json& j) {
  ModelConfig c;
  auto need = [&](const char* key) -> const nlohmann::json& {
    MOE_CHECK(j.contains(key) && !j[key].is_null(), "config.json lacks '", key, "'");
    return j[key];
  };
  const std::string type = j.value("model_type", std::string());
  MOE_CHECK(type == "olmoe", "config.json has model_type '", type, "'; import-hf reads OLMoE models (model_type 'olmoe')");
  c.vocab_size = need("vocab_size").get<int64_t>();
  c.hidden_size = need("hidden_size").get<int64_t>();
  c.intermediate_size = need("intermediate_size").get<int64_t>();
  c.num_hidden_layers = need("num_hidden_layers").get<int64_t>();
  c.num_attention_heads = need("num_attention_heads").get<int64_t>();
  c.num_key_value_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                              ? j["num_key_value_heads"].get<int64_t>()
                              : c.num_attention_heads;
  c.num_experts = need("num_experts").get<int64_t>();
  c.num_experts_per_tok = need("num_experts_per_tok").get<int64_t>();
  c.norm_topk_prob = j.value("norm_topk_prob", false);
  c.rms_norm_eps = j.value("rms_norm_eps", 1e-5);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() && j["rope_parameters"].contains("rope_theta"))
    c.rope_theta = j["rope_parameters"]["rope_theta"].get<double>();
  else
    c.rope_theta = j.value("rope_theta", 10000.0);
  c.router_aux_loss_coef = j.value("router_aux_loss_coef", 0.01);
  c.init_std = j.value("initializer_range", 0.02);
  if (j.contains("eos_token_id") && j["eos_token_id"].is_number_integer()) c.eos_token_id = j["eos_token_id"].get<int64_t>();
  else c.eos_token_id = c.vocab_size - 1;
  MOE_CHECK(!j.contains("clip_qkv") || j["clip_qkv"].is_null(), "config.json sets clip_qkv, which moetrain does not model");
  MOE_CHECK(!j.value("tie_word_embeddings", false), "config.json ties the word embeddings; moetrain keeps the LM head separate");
  c.validate();
  return c;
}

ExportResult export_hf(const std::string& checkpoint, const std::string& out_dir, int64_t max_shard_bytes,
                       const std::vector<std::string>& tokenizer_files) {
  MOE_CHECK(max_shard_bytes > 0, "export-hf: the shard size must be > 0");
  MOE_CHECK(!fs::exists(out_dir), "export-hf: output '", out_dir, "' exists; choose a new directory");
  for (const auto& t : tokenizer_files) MOE_CHECK(fs::is_regular_file(t), "export-hf: tokenizer file '", t, "' not found");
  const std::string dir = resolve_checkpoint(checkpoint);
  CheckpointReader ckpt(dir);
  MOE_CHECK(ckpt.train_state().contains("config"), dir, ": train_state.json has no config");
  const Config cfg = parse_config(ckpt.train_state()["config"].get<std::string>(), dir + "/train_state.json");
  const nlohmann::json hf_config = olmoe_hf_config(cfg.model);
  const std::vector<HfTensor> tensors = hf_tensors(cfg.model, ckpt);

  // Shards: consecutive tensors up to max_shard_bytes each (a larger tensor gets a shard alone).
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t bytes = tensors[i].numel() * 4;
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(i);
    in_shard += bytes;
  }
  const std::string tmp = out_dir + ".tmp-" + std::to_string(getpid());
  fs::remove_all(tmp);
  std::error_code ec;
  fs::create_directories(tmp, ec);
  MOE_CHECK(!ec, "export-hf: cannot create ", tmp, ": ", ec.message());
  // Nothing half-written stays behind: the temporary directory goes if anything below fails.
  struct RemoveOnFailure {
    std::string path;
    bool armed = true;
    ~RemoveOnFailure() {
      std::error_code ignored;
      if (armed) fs::remove_all(path, ignored);
    }
  } cleanup{tmp};
  ExportResult r;
  r.out_dir = out_dir;
  r.shards = static_cast<int>(shards.size());
  nlohmann::json weight_map = nlohmann::json::object();
  std::vector<float> buffer;  // one tensor at a time
  char name_buf[64];
  for (size_t s = 0; s < shards.size(); ++s) {
    std::snprintf(name_buf, sizeof(name_buf), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    SafetensorsWriter w;
    w.set_metadata("format", "pt");
    for (size_t i : shards[s]) w.add(tensors[i].name, DType::F32, tensors[i].shape);
    w.open(tmp + "/" + name_buf);
    for (size_t i : shards[s]) {
      buffer.resize(static_cast<size_t>(tensors[i].numel()));
      tensors[i].fill(buffer.data());
      w.write(buffer.data(), buffer.size() * 4);
      weight_map[tensors[i].name] = name_buf;
      r.bytes += tensors[i].numel() * 4;
      ++r.tensors;
    }
    w.finish();
  }
  write_text(tmp + "/config.json", hf_config.dump(2) + "\n");
  write_text(tmp + "/model.safetensors.index.json",
             nlohmann::json({{"metadata", {{"total_size", r.bytes}}}, {"weight_map", weight_map}}).dump(2) + "\n");
  for (const auto& t : tokenizer_files) fs::copy_file(t, tmp + "/" + fs::path(t).filename().string());
  fs::rename(tmp, out_dir, ec);
  MOE_CHECK(!ec, "export-hf: cannot rename ", tmp, " to ", out_dir, ": ", ec.message());
  cleanup.armed = false;
  r.peak_rss_bytes = peak_rss_bytes();
  return r;
}

ImportResult import_hf(const std::string& hf_dir, const std::string& out_run_dir) {
  MOE_CHECK(!fs::exists(out_run_dir) || fs::is_empty(out_run_dir), "import-hf: output '", out_run_dir,
            "' exists and is not empty; choose a new directory");
  const bool created_out = !fs::exists(out_run_dir);
  const ModelConfig mc = model_config_from_hf(read_json(hf_dir + "/config.json"));
  // Which file holds each tensor.
  std::map<std::string, std::string> where;
  const std::string index = hf_dir + "/model.safetensors.index.json";
  std::map<std::string, std::unique_ptr<SafetensorsReader>> files;
  if (fs::exists(index)) {
    const nlohmann::json j = read_json(index);
    MOE_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), index, " has no weight_map");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) where[it.key()] = it.value().get<std::string>();
  } else {
    MOE_CHECK(fs::exists(hf_dir + "/model.safetensors"), hf_dir, " has neither model.safetensors nor model.safetensors.index.json");
    SafetensorsReader f(hf_dir + "/model.safetensors");
    for (const auto& e : f.entries()) where[e.name] = "model.safetensors";
  }
  auto file_of = [&](const std::string& name) -> const SafetensorsReader& {
    auto it = where.find(name);
    MOE_CHECK(it != where.end(), hf_dir, ": tensor '", name, "' is missing");
    auto& slot = files[it->second];
    if (!slot) slot = std::make_unique<SafetensorsReader>(hf_dir + "/" + it->second);
    return *slot;
  };
  const ParamRegistry reg = build_registry(mc, 0, mc.num_experts, ParamLayout::ByReplicaGroup);
  const int64_t D = mc.hidden_size, H = mc.intermediate_size;
  ImportResult r;
  // The slices of one rank-0 file: weights (produced from the HF tensors) and zero moments.
  std::vector<CheckpointSlice> slices;
  std::vector<int> source;  // registry index of each slice, or -1 for zeros
  for (int i = 0; i < static_cast<int>(reg.entries().size()); ++i) {
    const ParamEntry& e = reg.entry(i);
    const int64_t n = e.global_shape.numel();
    slices.push_back({e.name, DType::F32, dims(e.global_shape), 0, n, nullptr});
    source.push_back(i);
    slices.push_back({e.name + ".exp_avg", DType::F32, dims(e.global_shape), 0, n, nullptr});
    source.push_back(-1);
    slices.push_back({e.name + ".exp_avg_sq", DType::F32, dims(e.global_shape), 0, n, nullptr});
    source.push_back(-1);
  }
  auto produce = [&](size_t s, void* dst_bytes) {
    float* dst = static_cast<float*>(dst_bytes);
    const CheckpointSlice& slice = slices[s];
    if (source[s] < 0) {
      std::memset(dst, 0, static_cast<size_t>(slice.end - slice.begin) * 4);
      return;
    }
    const std::string& name = slice.key;
    const bool gate_up = name.find(".mlp.experts.gate_up_proj") != std::string::npos;
    const bool down = name.find(".mlp.experts.down_proj") != std::string::npos;
    if ((gate_up || down) && !where.count(name)) {  // per-expert Hub layout
      const std::string base = name.substr(0, name.rfind('.') + 1);
      for (int64_t x = 0; x < mc.num_experts; ++x) {
        const std::string p = base + std::to_string(x) + ".";
        if (gate_up) {
          to_f32(file_of(p + "gate_proj.weight"), p + "gate_proj.weight", {H, D}, dst + x * 2 * H * D);
          to_f32(file_of(p + "up_proj.weight"), p + "up_proj.weight", {H, D}, dst + x * 2 * H * D + H * D);
        } else {
          to_f32(file_of(p + "down_proj.weight"), p + "down_proj.weight", {D, H}, dst + x * D * H);
        }
      }
      return;
    }
    if (gate_up || down) r.fused_experts = true;
    to_f32(file_of(name), name, slice.global_shape, dst);
  };
  const std::string tmp = begin_checkpoint(out_run_dir, 0);
  std::vector<CheckpointChunk> chunks;
  try {
    chunks = write_rank_file(tmp, 0, slices, produce);
  } catch (...) {  // nothing half-written stays behind
    std::error_code ignored;
    fs::remove_all(created_out ? out_run_dir : tmp, ignored);
    throw;
  }
  r.tensors = static_cast<int64_t>(reg.entries().size());

  Config cfg;
  cfg.name = fs::path(out_run_dir).filename().string();
  cfg.model = mc;
  cfg.run.dir = out_run_dir;
  const std::string config_text = config_to_toml(cfg);
  nlohmann::json st;
  st["step"] = 0;
  st["skipped_steps"] = 0;
  st["source"] = {{"import_hf", hf_dir}, {"note", "AdamW moments start at zero"}};
  st["model_config"] = model_config_toml(mc);
  st["config"] = config_text;
  write_checkpoint_index(tmp, 0, chunks, st);
  r.checkpoint_dir = commit_checkpoint(out_run_dir, 0);
  r.config_path = out_run_dir + "/config.toml";
  write_text(r.config_path, config_text);
  return r;
}

}  // namespace moe

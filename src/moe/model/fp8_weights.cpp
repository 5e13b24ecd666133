#include "moe/model/fp8_weights.h"

#include <string>
#include <tuple>

#include "moe/core/error.h"

namespace moe {
namespace {

// Each quantized matrix of a layer with its cache: fn(name, weight, cache). The one list of what
// FP8 quantizes.
template <typename Fn>
void for_each_quantized(const LayerWeights& w, Fp8LayerWeights& c, Fn&& fn) {
  fn("q_proj", w.q_proj, c.q_proj);
  fn("k_proj", w.k_proj, c.k_proj);
  fn("v_proj", w.v_proj, c.v_proj);
  fn("o_proj", w.o_proj, c.o_proj);
  fn("experts_gate_up", w.experts_gate_up, c.experts_gate_up);
  fn("experts_down", w.experts_down, c.experts_down);
  fn("shared_gate_up", w.shared_gate_up, c.shared_gate_up);
  fn("shared_down", w.shared_down, c.shared_down);
  fn("mlp_gate_up", w.mlp_gate_up, c.mlp_gate_up);
  fn("mlp_down", w.mlp_down, c.mlp_down);
}

// The shapes of layer l's quantized matrices ({} where the layer has none), as bind_weights gives them.
LayerWeights shapes_of_layer(const ModelConfig& cfg, int64_t l, int64_t local_experts) {
  const int64_t D = cfg.hidden_size, hd = cfg.head_dim();
  const int64_t q_out = cfg.num_attention_heads * hd, kv_out = cfg.num_key_value_heads * hd;
  LayerWeights s;
  auto shape = [](Tensor& t, Shape sh) { t = Tensor(nullptr, DType::F32, sh); };
  shape(s.q_proj, {q_out, D});
  shape(s.k_proj, {kv_out, D});
  shape(s.v_proj, {kv_out, D});
  shape(s.o_proj, {D, q_out});
  if (cfg.is_moe_layer(l)) {
    const int64_t H = cfg.intermediate_size;
    shape(s.experts_gate_up, {local_experts, 2 * H, D});
    shape(s.experts_down, {local_experts, D, H});
    if (const int64_t S = cfg.shared_expert_intermediate_size; S > 0) {
      shape(s.shared_gate_up, {2 * S, D});
      shape(s.shared_down, {D, S});
    }
  } else {
    const int64_t Hd = cfg.dense_intermediate_size;
    shape(s.mlp_gate_up, {2 * Hd, D});
    shape(s.mlp_down, {D, Hd});
  }
  return s;
}

// Whether the rank holds layer l (held: flags per layer, empty = all).
bool holds(const std::vector<bool>& held, int64_t l, const ModelConfig& cfg) {
  MOE_CHECK(held.empty() || static_cast<int64_t>(held.size()) == cfg.num_hidden_layers, "FP8 weight cache: ",
            held.size(), " held-layer flags for ", cfg.num_hidden_layers, " layers");
  return held.empty() || held[static_cast<size_t>(l)];
}

Shape transposed(const Shape& s) {
  Shape t = s;
  std::swap(t.dims[t.ndim - 1], t.dims[t.ndim - 2]);
  return t;
}

}  // namespace

std::vector<bool> held_layers(const ModelConfig& cfg, const ParamRegistry& reg) {
  std::vector<bool> held(static_cast<size_t>(cfg.num_hidden_layers));
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    held[static_cast<size_t>(l)] = reg.has("model.layers." + std::to_string(l) + ".input_layernorm.weight");
  return held;
}

int64_t fp8_quantized_numel(const ModelConfig& cfg, int64_t local_experts, const std::vector<bool>& held) {
  int64_t n = 0;
  Fp8LayerWeights unused;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    if (holds(held, l, cfg))
      for_each_quantized(shapes_of_layer(cfg, l, local_experts), unused,
                         [&](const char*, const Tensor& t, Fp8Weight&) { n += t.shape.ndim == 0 ? 0 : t.numel(); });
  return n;
}

std::vector<Tensor> fp8_quantized_matrices(const ModelWeights& w) {
  std::vector<Tensor> out;
  Fp8LayerWeights unused;
  for (const LayerWeights& lw : w.layers)
    for_each_quantized(lw, unused, [&](const char*, const Tensor& t, Fp8Weight&) {
      if (!t.empty()) out.push_back(t);
    });
  return out;
}

Fp8WeightCache::Fp8WeightCache(const ModelConfig& cfg, int64_t local_experts, Arena& arena,
                               const std::vector<bool>& held)
    : cfg_(cfg), arena_(arena), layers_(cfg.num_hidden_layers) {
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    if (!holds(held, l, cfg)) continue;  // another pipeline stage's layer: no caches
    for_each_quantized(shapes_of_layer(cfg, l, local_experts), layers_[l], [&](const char* name, const Tensor& t,
                                                                              Fp8Weight& fw) {
      const Shape shape = t.shape;
      if (shape.ndim == 0) return;  // the layer has no such matrix
      const std::string base = "compute_weights.fp8.layer." + std::to_string(l) + "." + name;
      fw.w.tiles = fw.w_t.tiles = Fp8Tiles::Blocks;
      for (auto [target, sh, suffix] : {std::tuple{&fw.w, shape, ""}, std::tuple{&fw.w_t, transposed(shape), "_t"}}) {
        pending_.push_back({target, arena.reserve(base + suffix + ".codes", DType::FP8_E4M3, sh),
                            arena.reserve(base + suffix + ".scales", DType::F32, fp8_scale_shape(sh, Fp8Tiles::Blocks))});
      }
    });
  }
}

void Fp8WeightCache::bind() {
  if (bound_) return;
  MOE_CHECK(arena_.committed(), "Fp8WeightCache used before its arena '", arena_.name(), "' was committed");
  for (const Pending& p : pending_) {
    p.target->codes = arena_.get(p.codes);
    p.target->scales = arena_.get(p.scales);
  }
  bound_ = true;
}

void Fp8WeightCache::refresh(const ModelWeights& master, Stream stream) {
  for (const auto& [w, cache] : targets(master)) fp8_quantize_blocks(cache.w, cache.w_t, w, stream);
}

std::vector<std::pair<Tensor, Fp8Weight>> Fp8WeightCache::targets(const ModelWeights& master) {
  bind();
  MOE_CHECK(master.layers.size() == layers_.size(), "Fp8WeightCache: ", master.layers.size(),
            " layers of weights for a cache of ", layers_.size());
  std::vector<std::pair<Tensor, Fp8Weight>> out;
  for (size_t l = 0; l < layers_.size(); ++l) {
    for_each_quantized(master.layers[l], layers_[l], [&](const char* name, const Tensor& w, Fp8Weight& fw) {
      MOE_CHECK(fw.empty() || !w.empty(), "Fp8WeightCache: layer ", l, " has no ", name, " weight to quantize");
      MOE_CHECK(!fw.empty() || w.empty(), "Fp8WeightCache: layer ", l, "'s ", name, " weight has no cache");
      if (!fw.empty()) out.emplace_back(w, fw);
    });
  }
  return out;
}

const Fp8LayerWeights& Fp8WeightCache::layer(int64_t l) const {
  const_cast<Fp8WeightCache*>(this)->bind();
  return layers_.at(l);
}

}  // namespace moe

#include "moe/model/transformer.h"

#include <algorithm>
#include <map>

#include "moe/core/device.h"
#include "moe/ops/elementwise.h"
#include "moe/ops/embedding.h"
#include "moe/ops/fp8.h"
#include "moe/ops/gemm.h"
#include "moe/ops/loss.h"
#include "moe/ops/norm.h"
#include "moe/ops/router.h"

namespace moe {
namespace {

// Linear layer y = x W^T (+= when accumulate).
void linear(Tensor y, Tensor x, Tensor w, bool accumulate = false) {
  matmul(y, x, w, false, true, 1.0f, accumulate ? 1.0f : 0.0f);
}

// Logits per LM-head chunk at most: on the CPU 64 MiB (cache-friendly chunks); on the GPU 1 GiB,
// so the chunk's three products are large enough to run at the GEMM rate (with 64 MiB a
// 50304-token vocabulary gave 333-row chunks and the LM head ran at ~40% of it).
constexpr int64_t kHeadWorkspaceFloatsCpu = int64_t{16} << 20;
constexpr int64_t kHeadWorkspaceFloatsGpu = int64_t{256} << 20;

}  // namespace

Transformer::Transformer(const ModelConfig& cfg, int64_t batch, int64_t seq_len, Arena& arena,
                         TokenDispatcher& dispatcher, int lease_slots, Recompute recompute, Precision precision,
                         Payload payload, const ModelChunks& chunks)
    : cfg_(cfg),
      batch_(batch),
      seq_len_(seq_len),
      rows_(batch * seq_len),
      dev_(arena.device()),
      act_(arena.device() == Device::CUDA ? DType::BF16 : DType::F32),
      recompute_(recompute),
      precision_(precision),
      payload_(payload),
      gathered_expert_grads_(precision == Precision::FP8 && payload == Payload::BF16 &&
                             dispatcher.routes_stay_local()),
      arena_(arena),
      dispatcher_(dispatcher) {
  cfg_.validate();
  // The expert GEMM consumes the moved FP8 rows as its operand; a BF16 product would have to
  // dequantize them, rounding the activations for no saving in compute.
  MOE_CHECK(payload != Payload::FP8 || precision == Precision::FP8,
            "ep.payload = \"fp8\" moves the FP8 operand of the expert GEMM and needs train.precision = \"fp8\"; "
            "set train.precision = \"fp8\" or ep.payload = \"bf16\"");
  const int64_t R = rows_, D = cfg.hidden_size, L = cfg.num_hidden_layers, hd = cfg.head_dim();
  const int64_t Hq = cfg.num_attention_heads, Hkv = cfg.num_key_value_heads;
  const int64_t Qo = Hq * hd, KVo = Hkv * hd, V = cfg.vocab_size;
  const int64_t N = cfg.num_experts, K = cfg.num_experts_per_tok, H = cfg.intermediate_size;
  const int64_t E = dispatcher.local_experts();
  capacity_ = dispatcher.expert_rows(R, K);
  proj_ = std::make_unique<Projections>(cfg, precision, R, capacity_, E, arena);
  attn_shape_ = AttentionShape{batch, seq_len, Hq, Hkv, hd};
  // Activations and their gradients in act_ (BF16 on the GPU); statistics, router logits and
  // scores, top-K weights and losses stay F32 on every device.
  const auto X = act_, F = DType::F32, I = DType::I32;
  // What every layer keeps for its backward (model/recompute.h). A buffer a layer keeps is its own
  // ("layer.<l>.<name>"); one it recomputes is the single "recompute.<name>" all layers share.
  const bool keep_block = recompute != Recompute::Block;
  const bool keep_attention = recompute == Recompute::None || recompute == Recompute::Experts;
  const bool keep_experts = recompute == Recompute::None || recompute == Recompute::Attention;
  std::map<std::string, std::pair<Arena::Slot, Shape>> shared;  // recompute.<name>: slot, shape

  chunks_ = chunks.layers.empty() ? std::vector<std::pair<int64_t, int64_t>>{{0, L}} : chunks.layers;
  std::vector<bool> held(L, false);
  for (const auto& [first, end] : chunks_) {
    MOE_CHECK(0 <= first && first < end && end <= L, "Transformer: chunk [", first, ", ", end, ") outside the ", L,
              " layers or empty");
    for (int64_t l = first; l < end; ++l) {
      MOE_CHECK(!held[l], "Transformer: layer ", l, " is in two chunks");
      held[l] = true;
    }
  }
  const int sets = chunks.activation_sets;
  MOE_CHECK(sets >= 1, "Transformer: activation_sets = ", sets, " must be at least 1");
  h_.assign(sets, std::vector<Tensor>(L + 1));
  layers_.assign(sets, std::vector<LayerActs>(L));
  dh_in_.assign(sets, std::vector<Tensor>(chunks_.size()));
  int64_t ffn_width = 0;  // widest dense MLP / shared expert, for the shared backward scratch
  for (int set = 0; set < sets; ++set) {
  // Set 0 keeps the names of a model without pipeline ("h.<l>", "layer.<l>.<name>").
  const std::string set_prefix = set == 0 ? "" : "set" + std::to_string(set) + ".";
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const auto [first, end] = chunks_[c];
    for (int64_t l = first; l <= end; ++l) reserve(h_[set][l], set_prefix + "h." + std::to_string(l), X, {R, D});
    if (first > 0) reserve(dh_in_[set][c], set_prefix + "grad.chunk_input." + std::to_string(first), X, {R, D});
  }
  for (int64_t l = 0; l < L; ++l) {
    if (!held[l]) continue;
    LayerActs& A = layers_[set][l];
    auto layer_buffer = [&](Tensor& t, const std::string& name, DType dtype, Shape shape, bool keep) {
      if (keep) return reserve(t, set_prefix + "layer." + std::to_string(l) + "." + name, dtype, shape);
      auto it = shared.find(name);
      if (it == shared.end())
        it = shared.emplace(name, std::make_pair(arena.reserve("activations.recompute." + name, dtype, shape), shape))
                 .first;
      MOE_CHECK(it->second.second == shape, "recompute buffer '", name, "' has another shape in layer ", l);
      pending_.emplace_back(&t, it->second.first);
    };
    // What the backward keeps of a SwiGLU output of `width` over `rows`: in FP8 its columns operand
    // (codes [width, round_up(rows, 128)] over `segments`), else the output.
    auto fp8_columns = [&](Fp8Tensor& t, const std::string& name, int64_t width, int64_t rows, int64_t segments,
                           bool keep) {
      const int64_t columns = fp8_columns_capacity(rows, segments);
      layer_buffer(t.codes, name + "_columns.codes", DType::FP8_E4M3, {width, columns}, keep);
      layer_buffer(t.scales, name + "_columns.scales", F, fp8_scale_shape({width, columns}, Fp8Tiles::Columns), keep);
      t.tiles = Fp8Tiles::Columns;
    };
    auto ffn_act = [&](Tensor& act, Fp8Tensor& columns, const std::string& name, int64_t width, bool keep) {
      if (precision == Precision::FP8) return fp8_columns(columns, name, width, R, 1, keep);
      layer_buffer(act, name, X, {R, width}, keep);
    };
    layer_buffer(A.h_mid, "h_mid", X, {R, D}, keep_block);
    layer_buffer(A.a, "attn_norm_out", X, {R, D}, keep_attention);
    layer_buffer(A.rstd1, "attn_norm_rstd", F, {R}, keep_attention);
    layer_buffer(A.q_raw, "q_proj_out", X, {R, Qo}, keep_attention);
    layer_buffer(A.k_raw, "k_proj_out", X, {R, KVo}, keep_attention);
    if (cfg.qk_norm != QkNorm::None) {
      layer_buffer(A.q, "q", X, {R, Qo}, keep_attention);
      layer_buffer(A.k, "k", X, {R, KVo}, keep_attention);
      const bool per_head = cfg.qk_norm == QkNorm::PerHead;
      layer_buffer(A.q_rstd, "q_norm_rstd", F, {per_head ? R * Hq : R}, keep_attention);
      layer_buffer(A.k_rstd, "k_norm_rstd", F, {per_head ? R * Hkv : R}, keep_attention);
    }
    layer_buffer(A.v, "v", X, {R, KVo}, keep_attention);
    layer_buffer(A.att, "attn_out", X, {R, Qo}, keep_attention);
    layer_buffer(A.lse, "attn_lse", F, {batch, Hq, seq_len}, keep_attention);
    layer_buffer(A.m, "ffn_norm_out", X, {R, D}, keep_block);
    layer_buffer(A.rstd2, "ffn_norm_rstd", F, {R}, keep_block);
    if (cfg.is_moe_layer(l)) {
      layer_buffer(A.logits, "router_logits", F, {R, N}, keep_block);
      layer_buffer(A.scores, "router_scores", F, {R, N}, keep_block);
      // The routing decision and the losses are kept in every mode: backward replays the decision.
      layer_buffer(A.topk_idx, "topk_idx", I, {R, K}, true);
      layer_buffer(A.topk_w, "topk_weight", F, {R, K}, true);
      layer_buffer(A.counts, "expert_counts", I, {N}, true);
      layer_buffer(A.route_index, "route_index", I, {R * K}, true);
      layer_buffer(A.offsets, "expert_offsets", I, {E + 1}, true);
      layer_buffer(A.gu, "expert_gate_up", X, {capacity_, 2 * H}, keep_experts);
      if (fp8_act_columns())
        fp8_columns(A.act_columns, "expert_act", H, capacity_, E, keep_experts);
      else
        layer_buffer(A.act, "expert_act", X, {capacity_, H}, keep_experts);
      layer_buffer(A.lb, "lb_loss", F, {1}, true);
      layer_buffer(A.z, "z_loss", F, {1}, true);
      if (const int64_t S = cfg.shared_expert_intermediate_size; S > 0) {
        layer_buffer(A.shared_gu, "shared_gate_up", X, {R, 2 * S}, keep_experts);
        ffn_act(A.shared_act, A.shared_act_columns, "shared_act", S, keep_experts);
        ffn_width = std::max(ffn_width, S);
      }
    } else {
      const int64_t Hd = cfg.dense_intermediate_size;
      layer_buffer(A.mlp_gu, "mlp_gate_up", X, {R, 2 * Hd}, keep_block);
      ffn_act(A.mlp_act, A.mlp_act_columns, "mlp_act", Hd, keep_block);
      ffn_width = std::max(ffn_width, Hd);
    }
  }
  }
  Scratch& s = s_;
  reserve(s.dres, "grad.residual", X, {R, D});
  reserve(s.dm, "grad.ffn_norm_out", X, {R, D});
  reserve(s.datt, "grad.attn_out", X, {R, Qo});
  reserve(s.dq, "grad.q", X, {R, Qo});
  reserve(s.dk, "grad.k", X, {R, KVo});
  reserve(s.dv, "grad.v", X, {R, KVo});
  if (cfg.qk_norm != QkNorm::None) {
    reserve(s.dq_raw, "grad.q_proj_out", X, {R, Qo});
    reserve(s.dk_raw, "grad.k_proj_out", X, {R, KVo});
  }
  reserve(s.da, "grad.attn_norm_out", X, {R, D});
  // The MoE layers this rank runs: [moe_first, moe_end) bounds them (its lease pools).
  int64_t moe_first = L, moe_end = 0;
  for (int64_t l = 0; l < L; ++l)
    if (held[l] && cfg.is_moe_layer(l)) moe_first = std::min(moe_first, l), moe_end = l + 1;
  const bool holds_moe = moe_first < moe_end;
  if (holds_moe) {
    reserve(s.dlogits, "grad.router_logits", F, {R, N});
    reserve(s.dw, "grad.topk_weight", F, {R, K});
    reserve(s.dact, "grad.expert_act", X, {capacity_, H});
    // FP8 quantizes d(gate/up) as the SwiGLU backward computes it, but in the layers recompute =
    // experts recomputes (their SwiGLU backward also writes the output).
    if (!fp8_act_columns()) reserve(s.dgu, "grad.expert_gate_up", X, {capacity_, 2 * H});
    if (X != F) reserve(s.dlogits_act, "grad.router_logits_" + std::string(dtype_name(X)), X, {R, N});
    if (gathered_expert_grads_) reserve(s.route_of_row, "grad.route_of_row", I, {capacity_});
    reserve(s.router_ws, "router_losses_workspace", F, {router_losses_workspace_elems(dev_, R, N)});
  }
  if (ffn_width > 0) {
    reserve(s.dffn_act, "grad.mlp_act", X, {R, ffn_width});
    if (precision_ != Precision::FP8) reserve(s.dffn_gu, "grad.mlp_gate_up", X, {R, 2 * ffn_width});
  }
  if (holds_moe) {
    if (!keep_block) {
      reserve(s.recompute_topk_idx, "recompute.router_topk_idx", I, {R, K});
      reserve(s.recompute_topk_w, "recompute.router_topk_weight", F, {R, K});
    }
    dispatcher.reserve_buffers(DispatchShape{R, K, D, static_cast<int>(moe_end), lease_slots,
                                             static_cast<int>(moe_first), X, !keep_block,
                                             fp8_expert_input() ? Payload::FP8 : Payload::BF16,
                                             /*grad_expert_out=*/!gathered_expert_grads_},
                               arena);
  }
  // The CPU attention keeps its workspace here; cuDNN manages its own (docs/architecture.md).
  const int64_t attn_ws = dev_ == Device::CPU ? attention_workspace_elems(attn_shape_) : 0;
  reserve(s.attn_ws, "attention_workspace", F, {std::max<int64_t>(1, attn_ws)});
  if (held[L - 1]) {  // the LM head's rank
    const int64_t head_floats = dev_ == Device::CUDA ? kHeadWorkspaceFloatsGpu : kHeadWorkspaceFloatsCpu;
    const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(R, head_floats / V));
    reserve(s.head_ws, "lm_head_workspace", F, {chunk, V});
    reserve(s.hn, "final_norm_out", X, {R, D});
    reserve(s.rstd_f, "final_norm_rstd", F, {R});
  }
  reserve(s.loss_sum, "lm_loss_sum", F, {1});
  stats_slot_ = arena.reserve("activations.microbatch_stats", F, {kNumMicrobatchStats});
}

void Transformer::set_fp8_weights(const Fp8WeightCache* cache) {
  MOE_CHECK((cache != nullptr) == (precision_ == Precision::FP8), "Transformer::set_fp8_weights: a model of precision ",
            to_string(precision_), (cache ? " takes no FP8 weight cache" : " needs its FP8 weight cache"));
  fp8_ = cache;
}

const Fp8LayerWeights& Transformer::fp8_layer(int64_t l) const {
  static const Fp8LayerWeights bf16;  // empty caches: every product in the activation dtype
  if (precision_ != Precision::FP8) return bf16;
  MOE_CHECK(fp8_ != nullptr, "Transformer: precision fp8 without an FP8 weight cache (set_fp8_weights)");
  // Every layer has q_proj: an empty cache here is a layer the cache was not built for (another
  // pipeline stage's), which would otherwise run its products in BF16 without a word.
  const Fp8LayerWeights& w = fp8_->layer(l);
  MOE_CHECK(!w.q_proj.empty(), "Transformer: layer ", l, " has no FP8 weight cache (a layer this rank does not hold)");
  return w;
}

void Transformer::reserve(Tensor& t, const std::string& name, DType dtype, Shape shape) {
  pending_.emplace_back(&t, arena_.reserve("activations." + name, dtype, shape));
}

void Transformer::bind() {
  if (bound_) return;
  MOE_CHECK(arena_.committed(), "Transformer used before its arena '", arena_.name(), "' was committed");
  for (auto& [tensor, slot] : pending_) *tensor = arena_.get(slot);
  bound_ = true;
}

// The layers' forward passes: transformer_layer_forward.cpp.

void Transformer::select(int chunk, int set) {
  bind();
  MOE_CHECK(chunk >= 0 && chunk < chunks(), "Transformer: chunk ", chunk, " of ", chunks());
  MOE_CHECK(set >= 0 && set < static_cast<int>(h_.size()), "Transformer: activation set ", set, " of ", h_.size());
  set_ = set;
}

void Transformer::forward_layers(int chunk, const ModelWeights& w, Tensor tokens, uint64_t routing_seed,
                                 const RoutingState& rs, bool backward_follows) {
  auto enter = [&](int block) { if (hooks_) hooks_->before_forward(block); };
  auto leave = [&](int block) { if (hooks_ && !backward_follows) hooks_->after_forward_only(block); };
  const auto [first, end] = chunks_[chunk];
  if (first == 0) {
    MOE_CHECK(tokens.numel() == rows_, "forward: got ", tokens.numel(), " tokens, the model was planned for ", rows_);
    enter(0);
    embedding_forward(h(0), w.embed, tokens);
    leave(0);
  }
  for (int64_t l = first; l < end; ++l) {
    LayerActs& A = layer(l);
    const LayerWeights& lw = w.layers[l];
    const Fp8LayerWeights& lf = fp8_layer(l);
    enter(static_cast<int>(l) + 1);
    attention_forward_layer(lw, lf, A, h(l));
    const Fp8Tensor m_rows = ffn_norm(l, lw, lf, A);
    if (cfg_.is_moe_layer(l))
      moe_forward_layer(l, lw, lf, A, h(l + 1), routing_seed, rs);
    else
      mlp_forward_layer(lw, lf, A, h(l + 1), m_rows);
    if (drops_activations(l)) scratch_holds_ = {set_, l};
    leave(static_cast<int>(l) + 1);
  }
}

void Transformer::forward(const ModelWeights& w, Tensor tokens, uint64_t routing_seed, const RoutingState& rs,
                          bool backward_follows) {
  MOE_CHECK(chunks() == 1 && has_embedding(0) && has_head(0),
            "Transformer: a whole-model pass needs all layers on this rank (use the chunk passes)");
  select(0, 0);
  forward_layers(0, w, tokens, routing_seed, rs, backward_follows);
  if (hooks_) hooks_->before_forward(static_cast<int>(cfg_.num_hidden_layers) + 1);  // held until the LM head has run
  rmsnorm_forward(s_.hn, s_.rstd_f, h(cfg_.num_hidden_layers), w.final_norm, static_cast<float>(cfg_.rms_norm_eps));
}

void Transformer::chunk_forward(int chunk, int set, const ModelWeights& w, Tensor tokens, uint64_t routing_seed,
                                const RoutingState& rs) {
  select(chunk, set);
  forward_layers(chunk, w, tokens, routing_seed, rs, /*backward_follows=*/true);
}

void Transformer::chunk_forward_loss(int chunk, int set, const ModelWeights& w, Tensor tokens, Tensor targets,
                                     uint64_t routing_seed, const RoutingState& rs, Tensor logits) {
  select(chunk, set);
  forward_layers(chunk, w, tokens, routing_seed, rs, /*backward_follows=*/false);
  release_leases();
  if (!has_head(chunk)) return;
  const int head = static_cast<int>(cfg_.num_hidden_layers) + 1;
  if (hooks_) hooks_->before_forward(head);
  rmsnorm_forward(s_.hn, s_.rstd_f, h(cfg_.num_hidden_layers), w.final_norm, static_cast<float>(cfg_.rms_norm_eps));
  lm_head_cross_entropy(s_.loss_sum, Tensor(), Tensor(), s_.hn, w.lm_head, targets, 0.0f, s_.head_ws);
  if (!logits.empty()) linear(logits, s_.hn, w.lm_head);
  if (hooks_) hooks_->after_forward_only(head);
}

Tensor Transformer::chunk_input(int chunk, int set) {
  select(chunk, set);
  return h(chunks_[chunk].first);
}

Tensor Transformer::chunk_output(int chunk, int set) {
  select(chunk, set);
  return h(chunks_[chunk].second);
}

Tensor Transformer::output_grad() {
  bind();
  return s_.dres;
}

Tensor Transformer::input_grad(int chunk, int set) {
  select(chunk, set);
  MOE_CHECK(!has_embedding(chunk), "Transformer::input_grad: chunk ", chunk, " starts with the embedding");
  return dh_in_[set][chunk];
}

bool Transformer::drops_activations(int64_t l) const {
  return recompute_ == Recompute::Attention || (recompute_ == Recompute::Experts && cfg_.is_moe_layer(l));
}

int64_t Transformer::library_workspace_bytes() const {
  return dev_ == Device::CUDA && attn_shape_.deterministic ? attention_deterministic_workspace_bytes(attn_shape_) : 0;
}

int64_t Transformer::moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) n += cfg_.is_moe_layer(l) ? 1 : 0;
  return n;
}

void Transformer::add_layer_stats(std::vector<ScalarTerm>& terms, int set, int64_t first, int64_t end) const {
  const float per_layer = 1.0f / static_cast<float>(std::max<int64_t>(1, moe_layers()));
  const int64_t E = dispatcher_.local_experts();
  for (int64_t l = first; l < end; ++l) {
    if (!cfg_.is_moe_layer(l)) continue;
    const LayerActs& A = layers_[set][l];
    terms.push_back({A.lb, 0, kStatLb, per_layer});
    terms.push_back({A.z, 0, kStatZ, per_layer});
    terms.push_back({A.offsets, E, kStatReceivedRows, 1.0f});
  }
}

void Transformer::add_stats(Tensor stats) const { add_chunk_stats(stats, 0, set_); }

void Transformer::add_chunk_stats(Tensor stats, int chunk, int set) const {
  MOE_CHECK(stats.dtype == DType::F32 && stats.numel() >= kNumMicrobatchStats && stats.device == dev_,
            "Transformer::add_stats: stats must be F32 with at least ", static_cast<int>(kNumMicrobatchStats),
            " elements on the model's device");
  MOE_CHECK(chunk >= 0 && chunk < chunks() && set >= 0 && set < static_cast<int>(h_.size()),
            "Transformer::add_chunk_stats: chunk ", chunk, " set ", set, " out of range");
  std::vector<ScalarTerm> terms;
  if (has_head(chunk)) terms.push_back({s_.loss_sum, 0, kStatLmSum, 1.0f});
  add_layer_stats(terms, set, chunks_[chunk].first, chunks_[chunk].second);
  accumulate_scalars(stats, terms);
}

MicrobatchLosses Transformer::losses() const {
  std::vector<float> st(kNumMicrobatchStats, 0.0f);
  Tensor stats = arena_.get(stats_slot_);
  fill_zero(stats);
  add_stats(stats);
  copy_from_tensor(st.data(), stats);
  MicrobatchLosses out;
  out.tokens = rows_;
  out.lm_loss_sum = st[kStatLmSum];
  out.lb_loss = st[kStatLb];
  out.z_loss = st[kStatZ];
  out.routes = rows_ * cfg_.num_experts_per_tok * moe_layers();
  out.received_rows = static_cast<int64_t>(st[kStatReceivedRows]);
  out.dropped_routes = out.routes - out.received_rows;  // summed over an EP group: routes sent - rows kept
  out.capacity_rows = capacity_ * moe_layers();
  return out;
}

void Transformer::release_leases() {
  for (LayerActs& A : layers_[set_])
    if (A.leased) {
      dispatcher_.release(A.lease);
      A.leased = false;
    }
}

void Transformer::forward_loss(const ModelWeights& w, Tensor tokens, Tensor targets, uint64_t routing_seed,
                               const RoutingState& rs) {
  forward(w, tokens, routing_seed, rs, false);
  release_leases();  // no backward follows
  lm_head_cross_entropy(s_.loss_sum, Tensor(), Tensor(), s_.hn, w.lm_head, targets, 0.0f, s_.head_ws);
  if (hooks_) hooks_->after_forward_only(static_cast<int>(cfg_.num_hidden_layers) + 1);
}

void Transformer::forward_logits(const ModelWeights& w, Tensor tokens, Tensor logits, uint64_t routing_seed,
                                 const RoutingState& rs) {
  forward(w, tokens, routing_seed, rs, false);
  release_leases();
  linear(logits, s_.hn, w.lm_head);
  if (hooks_) hooks_->after_forward_only(static_cast<int>(cfg_.num_hidden_layers) + 1);
}

// The layers' backward passes: transformer_layer_backward.cpp.

// d(final norm output) lands in s_.dm from the fused LM head and cross-entropy; its norm's backward
// turns it into d(h_L) in s_.dres, where the layers' backward starts.
void Transformer::head_loss_backward(const ModelWeights& w, const ModelWeights& g, Tensor targets,
                                     const StepScales& scales) {
  const int64_t L = cfg_.num_hidden_layers;
  lm_head_cross_entropy(s_.loss_sum, s_.dm, g.lm_head, s_.hn, w.lm_head, targets, scales.lm_grad_scale, s_.head_ws);
  rmsnorm_backward(s_.dres, g.final_norm, s_.dm, h(L), w.final_norm, s_.rstd_f, /*accumulate_dx=*/false);
  if (hooks_) hooks_->after_backward(static_cast<int>(L) + 1);
}

void Transformer::backward_layers(int chunk, const ModelWeights& w, const ModelWeights& g, Tensor tokens,
                                  const StepScales& scales) {
  Scratch& s = s_;
  const auto [first, end] = chunks_[chunk];
  for (int64_t l = end - 1; l >= first; --l) {
    if (hooks_) hooks_->before_backward(static_cast<int>(l) + 1);
    LayerActs& A = layer(l);
    const LayerWeights &lw = w.layers[l], &lg = g.layers[l];
    const Fp8LayerWeights& lf = fp8_layer(l);
    if (recompute_ == Recompute::Block) recompute_layer(l, lw, lf, A);
    // Experts and attention modes: the shared buffers may still hold this layer's forward.
    const bool fresh = scratch_holds_.set == set_ && scratch_holds_.layer == l;
    const bool recompute = drops_activations(l) && !fresh;
    if (recompute_ == Recompute::Block || recompute) ++recomputed_layers_;
    if (drops_activations(l)) scratch_holds_ = {};  // read, or written again below
    // s.dres = d(h_{l+1}); the feed-forward branch adds into d(h_mid) through its norm.
    if (cfg_.is_moe_layer(l))
      moe_backward_layer(lw, lf, lg, A, scales, recompute);
    else
      mlp_backward_layer(lw, lf, lg, A);
    rmsnorm_backward(s.dres, lg.post_norm, s.dm, A.h_mid, lw.post_norm, A.rstd2, /*accumulate_dx=*/true);
    attention_backward_layer(lw, lf, lg, A, h(l), recompute);
    if (hooks_) hooks_->after_backward(static_cast<int>(l) + 1);
  }
  if (first == 0) {
    if (hooks_) hooks_->before_backward(0);
    embedding_backward(g.embed, s.dres, tokens);
    if (hooks_) hooks_->after_backward(0);
  } else {
    copy(dh_in_[set_][chunk], s.dres);  // sent to the previous chunk while this scratch is reused
  }
}

void Transformer::chunk_backward(int chunk, int set, const ModelWeights& w, const ModelWeights& g, Tensor tokens,
                                 Tensor targets, const StepScales& scales) {
  select(chunk, set);
  if (has_head(chunk)) {
    if (hooks_) hooks_->before_forward(static_cast<int>(cfg_.num_hidden_layers) + 1);
    rmsnorm_forward(s_.hn, s_.rstd_f, h(cfg_.num_hidden_layers), w.final_norm, static_cast<float>(cfg_.rms_norm_eps));
    head_loss_backward(w, g, targets, scales);
  }
  backward_layers(chunk, w, g, tokens, scales);
}

void Transformer::forward_backward(const ModelWeights& w, const ModelWeights& g, Tensor tokens, Tensor targets,
                                   const StepScales& scales, uint64_t routing_seed, const RoutingState& rs) {
  forward(w, tokens, routing_seed, rs, true);
  // The LM head and cross-entropy run fused with their backward.
  head_loss_backward(w, g, targets, scales);
  backward_layers(0, w, g, tokens, scales);
}

}  // namespace moe

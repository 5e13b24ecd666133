#include "moe/train/step_work.h"

#include <algorithm>

#include "moe/core/error.h"
#include "moe/model/weights.h"
#include "moe/train/pipeline_layout.h"

namespace moe {

namespace {

constexpr double kActBytes = 2;  // BF16 activations (the GPU path)

// The model's widths, as doubles.
struct Widths {
  double d, q, kv, h, s, hd, n, k, v, seq;
  explicit Widths(const ModelConfig& c, int64_t seq_len)
      : d(static_cast<double>(c.hidden_size)),
        q(static_cast<double>(c.num_attention_heads * c.head_dim())),
        kv(static_cast<double>(c.num_key_value_heads * c.head_dim())),
        h(static_cast<double>(c.intermediate_size)),
        s(static_cast<double>(c.shared_expert_intermediate_size)),
        hd(static_cast<double>(c.dense_intermediate_size)),
        n(static_cast<double>(c.num_experts)),
        k(static_cast<double>(c.num_experts_per_tok)),
        v(static_cast<double>(c.vocab_size)),
        seq(static_cast<double>(seq_len)) {}
};

// Bytes per token of each layer's element-wise passes (step_work.h lists them).
double attention_forward_bytes(const Widths& w, bool qk_norm) {
  return kActBytes * (2 * w.d + (qk_norm ? 2 * (w.q + w.kv) : 0) + 2 * (w.q + w.kv) + 2 * w.d + 2 * w.d);
}
double attention_backward_bytes(const Widths& w, bool qk_norm) {
  return kActBytes * (2 * (w.q + w.kv) + (qk_norm ? 3 * (w.q + w.kv) : 0) + 4 * w.d + 4 * w.d);
}
double moe_forward_bytes(const Widths& w) {
  return kActBytes * (2 * w.k * w.d + 3 * w.k * w.h + w.k * w.d + w.d + 2 * w.d + 3 * w.s) + 8 * w.n;
}
double moe_backward_bytes(const Widths& w) {
  return kActBytes * (w.d + 2 * w.k * w.d + 5 * w.k * w.h + w.k * w.d + w.d + 5 * w.s) + 12 * w.n;
}
double mlp_forward_bytes(const Widths& w) { return kActBytes * (3 * w.hd + 2 * w.d); }
double mlp_backward_bytes(const Widths& w) { return kActBytes * 5 * w.hd; }
double head_bytes(const Widths& w) { return kActBytes * (6 * w.d + 2 * w.d) + 12 * w.v + 10 * w.d; }

// HBM bytes per token of one layer's FP8 quantize kernels: what the step split's "FP8 quantize" row
// times (quantize_rows / quantize_columns kernels, train/step_split.h), each kernel's reads and
// writes in full (per route: see step_work.h on capacity; the dense products' scale staging, a few
// words per tile, is left out). Quantizing a BF16 operand by rows or by columns: 2 bytes read, 1
// written; an output gradient by rows and columns in one pass: 2 read, 2 written; re-quantizing
// moved FP8 rows by columns (ep.payload = "fp8"): 1 and 1; gathered from the token rows (every route
// on the rank: the expert input's columns, the expert output gradient's rows and columns) as from
// the stored rows; the SwiGLU forward that quantizes its output: gate/up read (4 per unit), the
// output written only in FP8, by rows and by columns (2: the backward keeps the columns and has no
// columns pass of its own), except for the routed experts under recompute = "experts"
// (act_columns false): the output written in BF16 and FP8 rows (3), its columns quantized in the
// backward (3); the SwiGLU backward that quantizes d(gate/up) into both layouts (the same MLPs, with
// act_columns): gate, up and d(output) read (6 per unit), 2 h codes written by rows and by columns
// (4), in place of the plain backward and its output gradient's pass (8). Scales (4 bytes per 128
// elements) are left out.
// Quantization fused into RMSNorm or the dispatch scatter runs in those kernels ("other").
//   attention: o's input by rows (forward) and columns; the output gradients of q, k, v and o; the
//     norm output's columns (q, k and v share them). The norm writes the rows operand itself.
//   a SwiGLU MLP of `units` (an expert per route, the shared expert, a dense MLP): its input by rows
//     (`input_rows`: 0 where the norm or the scatter made them: scatter_fp8, with payload fp8 or
//     every route on the rank), the fused SwiGLU (with its output's columns, or those quantized in
//     the backward: act_columns, above), the output gradients of down and gate/up (the latter with
//     the SwiGLU backward where it quantizes), the input's columns.
double fp8_quantize_bytes(const Widths& w, bool moe_layer, bool scatter_fp8, bool payload_fp8, bool act_columns) {
  const double attention = 3 * w.q + 3 * w.q + 4 * (w.q + 2 * w.kv) + 4 * w.d + 3 * w.d;
  auto mlp = [&](double units, double input_rows, double input_columns, bool fp8_output = true) {
    const double swiglu_and_output_columns = fp8_output ? 6 * units : 7 * units + 3 * units;
    const double gate_up_grad = fp8_output ? 10 * units : 8 * units;
    return input_rows + swiglu_and_output_columns + 4 * w.d + gate_up_grad + input_columns;
  };
  if (!moe_layer) return attention + mlp(w.hd, 0, 3 * w.d);
  const double experts = w.k * mlp(w.h, scatter_fp8 ? 0 : 3 * w.d, payload_fp8 ? 2 * w.d : 3 * w.d, act_columns);
  return attention + experts + (w.s > 0 ? mlp(w.s, 3 * w.d, 3 * w.d) : 0);
}

// The same for what recompute repeats of one layer's forward (model/recompute.h): block, the layer's
// forward (o's input rows; the experts' input rows and their SwiGLU's FP8 layouts; the shared
// expert's input rows and SwiGLU; a dense MLP's SwiGLU, its input rows coming from the norm);
// experts, the gate/up inputs by rows again, the shared expert's input rows and SwiGLU (the routed SwiGLU output
// comes from the plain SwiGLU backward). Every recomputed SwiGLU writes the FP8 layouts (6 bytes per
// unit; the rows operand unused). Attention recompute quantizes only in the norm.
double fp8_recompute_quantize_bytes(const Widths& w, Recompute rc, bool moe_layer, bool scatter_fp8) {
  const double expert_rows = scatter_fp8 ? 0 : 3 * w.d;
  const double shared = moe_layer && w.s > 0 ? 3 * w.d + 6 * w.s : 0;  // input rows, SwiGLU
  if (rc == Recompute::Block) return 3 * w.q + (moe_layer ? w.k * (expert_rows + 6 * w.h) + shared : 6 * w.hd);
  if (rc == Recompute::Experts && moe_layer) return w.k * expert_rows + shared;
  return 0;
}

}  // namespace

RankLayout rank_layout(const Config& cfg, int64_t world, int stage) {
  RankLayout l;
  l.world = world;
  l.mode = cfg.parallel.mode;
  l.ep = cfg.parallel.mode == "fsdp" ? 1 : cfg.parallel.ep;
  l.pp = cfg.parallel.pp;
  l.virtual_stages = cfg.parallel.pp_virtual;
  if (l.pp > 1) {
    const ModelConfig& m = cfg.model;
    const PipelineLayout layout = plan_pipeline_layout(m, cfg.train.seq_len, static_cast<int>(l.pp),
                                                       static_cast<int>(l.virtual_stages), cfg.parallel.pp_layers);
    // Each stage's forward FLOPs (the layout's per-layer cost) and parameters (the registry's, by
    // block: 0 the embedding, 1 + l layer l, L + 1 the final norm and LM head).
    const int64_t L = m.num_hidden_layers;
    std::vector<size_t> stage_of_block(static_cast<size_t>(L + 2));
    std::vector<double> cost(static_cast<size_t>(l.pp), 0.0), params(static_cast<size_t>(l.pp), 0.0);
    for (int c = 0; c < layout.chunks(); ++c) {
      const auto r = static_cast<size_t>(layout.rank_of(c));
      for (int64_t layer = layout.first_layer(c); layer < layout.end_layer(c); ++layer) {
        cost[r] += layer_cost(m, cfg.train.seq_len, layer);
        stage_of_block[static_cast<size_t>(layer + 1)] = r;
      }
      if (c == 0) cost[r] += embedding_cost(m), stage_of_block[0] = r;
      if (c == layout.chunks() - 1) cost[r] += head_cost(m), stage_of_block[static_cast<size_t>(L + 1)] = r;
    }
    const ParamRegistry reg = build_registry(m, 0, m.num_experts);
    for (const ParamEntry& e : reg.entries())
      params[stage_of_block[static_cast<size_t>(param_block(m, e.name))]] += static_cast<double>(e.numel());
    const auto share = [&](const std::vector<double>& v) {
      double total = 0;
      for (double x : v) total += x;
      MOE_CHECK(stage < static_cast<int>(v.size()), "rank_layout: stage ", stage, " of ", v.size());
      return (stage >= 0 ? v[static_cast<size_t>(stage)] : *std::max_element(v.begin(), v.end())) / total;
    };
    l.stage_share = share(cost);
    l.stage_param_share = share(params);
  }
  return l;
}

StepWork step_work(const Config& cfg, const RankLayout& layout) {
  const ModelConfig& c = cfg.model;
  MOE_CHECK(layout.world >= 1 && layout.pp >= 1 && layout.world % layout.pp == 0, "rank layout: ", layout.world,
            " ranks cannot form ", layout.pp, " pipeline stages");
  MOE_CHECK(layout.stage_share > 0 || c.num_hidden_layers % layout.pp == 0, "rank layout: ", c.num_hidden_layers,
            " layers cannot be split into ", layout.pp, " equal pipeline stages");
  const int64_t dp = layout.dp();
  const bool fsdp = layout.mode == "fsdp";
  const int64_t ep = fsdp ? 1 : layout.ep;
  MOE_CHECK(ep >= 1 && dp % ep == 0, "rank layout: parallel.ep = ", ep, " must divide the ", dp, " data-parallel ranks");
  const int64_t per_step = cfg.train.micro_batch_size * dp;
  MOE_CHECK(cfg.train.global_batch_size % per_step == 0, "train.global_batch_size = ", cfg.train.global_batch_size,
            " is not a multiple of train.micro_batch_size x data-parallel ranks = ", cfg.train.micro_batch_size, " x ",
            dp);

  const Widths w(c, cfg.train.seq_len);
  const FlopCount f = count_flops(c, cfg.train.seq_len);
  const double L = static_cast<double>(c.num_hidden_layers);
  const double moe_layers = static_cast<double>(c.num_hidden_layers - c.first_k_dense_replace);
  const double dense_layers = L - moe_layers;
  const bool qk_norm = c.qk_norm != QkNorm::None;
  const bool fp8 = cfg.train.precision == Precision::FP8;
  const Recompute rc = cfg.train.recompute;
  const double equal_share = 1.0 / static_cast<double>(layout.pp);
  const double stage_share = layout.stage_share > 0 ? layout.stage_share : equal_share;
  const double param_share = layout.stage_param_share > 0 ? layout.stage_param_share : equal_share;

  StepWork s;
  s.pipeline_stages = layout.pp;
  s.pipeline_virtual_stages = layout.virtual_stages;
  s.microbatches = static_cast<double>(cfg.train.global_batch_size / per_step);
  s.tokens_per_microbatch = static_cast<double>(cfg.train.micro_batch_size * cfg.train.seq_len);
  s.tokens = s.microbatches * s.tokens_per_microbatch;
  const double T = s.tokens;

  // Matrix products. Parameters per token of one layer's products, for what recompute repeats.
  const double attn_proj = w.d * (w.q + 2 * w.kv) + w.q * w.d;
  const double moe_dense = w.d * w.n + 3 * w.d * w.s;  // router and shared expert
  const double mlp = 3 * w.d * w.hd;
  s.expert_flops = 6 * f.expert_params_per_token * T;
  s.dense_flops = 6 * (f.matmul_params_per_token - f.expert_params_per_token) * T;
  s.attention_flops = f.attention_flops_per_token * T;
  s.fp8_experts = fp8;
  if (fp8) s.fp8_dense_flops = 6 * T * (L * attn_proj + moe_layers * 3 * w.d * w.s + dense_layers * mlp);
  const double attention_forward_flops = 4 * w.seq * w.q;  // a third of the 12 S q convention, per layer and token
  double recompute_expert = 0, recompute_dense = 0, recompute_attention = 0, recompute_bytes = 0;
  // Experts and attention: the top layer that drops activations reads its forward's (its backward
  // follows at once: model/recompute.h). Counted without pipeline; a stage's chunks may or may not
  // get it depending on the schedule, so under pp every layer is counted (an upper bound).
  const double skipped = layout.pp == 1 ? 1 : 0;
  if (rc == Recompute::Experts) {
    const double recomputed = std::max(0.0, moe_layers - skipped);
    recompute_expert = recomputed * 2 * w.k * w.d * 2 * w.h;
    recompute_dense = recomputed * 2 * w.d * 2 * w.s;
    // The routed SwiGLU backward also writes the output; the shared expert's SwiGLU runs again.
    recompute_bytes = recomputed * kActBytes * (w.k * w.h + 3 * w.s);
  } else if (rc == Recompute::Attention) {
    const double recomputed = L - skipped;
    recompute_dense = recomputed * 2 * w.d * (w.q + 2 * w.kv);
    recompute_attention = recomputed * attention_forward_flops;
    recompute_bytes = recomputed * kActBytes * (2 * w.d + (qk_norm ? 2 * (w.q + w.kv) : 0) + 2 * (w.q + w.kv));
  } else if (rc == Recompute::Block) {
    recompute_expert = moe_layers * 2 * w.k * 3 * w.d * w.h;
    recompute_dense = 2 * (L * attn_proj + moe_layers * moe_dense + dense_layers * mlp);
    recompute_attention = L * attention_forward_flops;
    recompute_bytes = L * attention_forward_bytes(w, qk_norm) + moe_layers * moe_forward_bytes(w) +
                      dense_layers * mlp_forward_bytes(w);
  }
  s.expert_flops += recompute_expert * T;
  s.dense_flops += recompute_dense * T;
  s.attention_flops += recompute_attention * T;
  s.recompute_flops = (recompute_expert + recompute_dense + recompute_attention) * T;
  if (fp8)  // every recomputed dense product but the router's runs in FP8
    s.fp8_dense_flops += (recompute_dense - (rc == Recompute::Block ? 2 * moe_layers * w.d * w.n : 0)) * T;
  s.rows_per_expert = c.num_experts > 0 ? s.tokens_per_microbatch * w.k * static_cast<double>(ep) / w.n : 0;

  // Memory-bound passes.
  const double per_token = L * (attention_forward_bytes(w, qk_norm) + attention_backward_bytes(w, qk_norm)) +
                           moe_layers * (moe_forward_bytes(w) + moe_backward_bytes(w)) +
                           dense_layers * (mlp_forward_bytes(w) + mlp_backward_bytes(w)) + head_bytes(w);
  s.elementwise_bytes = (per_token + recompute_bytes) * T;
  if (fp8) {
    const bool payload_fp8 = cfg.ep.payload == Payload::FP8;
    // Every route on the rank (EP 1): the expert backward's operands come from the token rows
    // (model/transformer.h, gathered_expert_grads_) and the dispatch stores FP8 rows, as payload fp8's.
    // EP 1 is when the run's dispatcher keeps every route (make_run_dispatcher: the local one, or
    // rowwise over a group of one; TokenDispatcher::routes_stay_local).
    const bool gathered = !payload_fp8 && ep == 1;
    const bool scatter_fp8 = payload_fp8 || gathered;
    const bool act_columns = rc != Recompute::Experts;  // model/transformer.h: LayerActs::act_columns
    s.fp8_quantize_bytes = T * (moe_layers * fp8_quantize_bytes(w, true, scatter_fp8, payload_fp8, act_columns) +
                                dense_layers * fp8_quantize_bytes(w, false, false, false, true));
    // Recompute (the layers counted as above); experts: every MoE layer but the skipped top one.
    const double recomputed_moe = rc == Recompute::Block ? moe_layers : std::max(0.0, moe_layers - skipped);
    s.fp8_quantize_bytes += T * (recomputed_moe * fp8_recompute_quantize_bytes(w, rc, true, scatter_fp8) +
                                 dense_layers * fp8_recompute_quantize_bytes(w, rc, false, scatter_fp8));
    // Under recompute = "experts" the top MoE layer that is not recomputed (model/recompute.h) takes
    // the routed SwiGLU backward that quantizes d(gate/up) (10 bytes per unit where the plain one's
    // output gradient pass, counted above, moves 8).
    const double fused_top_moe = act_columns ? 0 : moe_layers - recomputed_moe;
    s.fp8_quantize_bytes += T * fused_top_moe * 2 * w.k * w.h;
    // The element-wise row moves the SwiGLU forwards that quantize (the fused kernel is timed in the
    // FP8 quantize row: counted above) and gains the FP8 codes the fused RMSNorms write (attention's
    // input, and a dense layer's MLP input), in every forward and in the recomputed ones.
    const double block = rc == Recompute::Block ? 1 : 0;
    const double attention_norms = L + block * L + (rc == Recompute::Attention ? L - skipped : 0);
    const double recomputed_swiglu = block * (moe_layers * (w.k * w.h + w.s) + dense_layers * w.hd) +
                                     (rc == Recompute::Experts ? std::max(0.0, moe_layers - skipped) * w.s : 0);
    const double fused_swiglu_units = moe_layers * (w.k * w.h + w.s) + dense_layers * w.hd + recomputed_swiglu;
    s.elementwise_bytes += T * (attention_norms + (1 + block) * dense_layers) * w.d;
    s.elementwise_bytes -= kActBytes * 3 * T * fused_swiglu_units;
    // So does the SwiGLU backward that quantizes d(gate/up) (every MLP but the routed experts of the
    // layers recompute = "experts" recomputes; counted above).
    const double fused_backward_units =
        moe_layers * ((act_columns ? w.k * w.h : 0) + w.s) + fused_top_moe * w.k * w.h + dense_layers * w.hd;
    s.elementwise_bytes -= kActBytes * 5 * T * fused_backward_units;
    // The FP8 dispatch scatter writes 1-byte codes where the BF16 one writes 2 (again under block).
    if (scatter_fp8) s.elementwise_bytes -= T * (1 + block) * moe_layers * w.k * w.d;
    // Gathered: the combine backward computes the weights' gradient only and stores no d(expert output).
    if (gathered) s.elementwise_bytes -= T * moe_layers * kActBytes * w.k * w.d;
    const double fp8_params = L * attn_proj + moe_layers * (w.n * 3 * w.d * w.h + 3 * w.d * w.s) + dense_layers * mlp;
    // One rank: AdamW writes the caches in its pass (2 bytes per parameter, counted in adamw_bytes
    // in place of the BF16 copy). ZeRO-1: a pass over the gathered weights, this rank's experts only.
    s.fp8_cache_bytes = dp == 1 ? 0 : 6 * fp8_params / static_cast<double>(ep);
    s.fp8_cache_in_adamw_bytes = dp == 1 ? 2 * fp8_params / static_cast<double>(ep) : 0;
  }

  // Parameters: the experts' and the rest, this rank's.
  const double expert_params = moe_layers * w.n * 3 * w.d * w.h;
  const double dense_params = f.total_params - expert_params;
  const double moments_saved = cfg.optim.moment_dtype == DType::BF16 ? 8 : 0;
  const double m = s.microbatches;
  if (fsdp) {
    const double shard = f.total_params / static_cast<double>(dp);
    s.params_updated = shard;
    s.adamw_bytes = (30 - moments_saved) * shard;
    s.optimizer_other_bytes = 4 * f.total_params * m + 4 * shard;  // full block gradients zeroed per microbatch
    s.expert_grad_accumulate_bytes = 4 * expert_params * m;
    s.fsdp_group = dp;
    const double embedding = w.v * w.d;  // not gathered again for its backward
    s.fsdp_gather_bytes = 2 * (2 * f.total_params - embedding) * m;
    s.fsdp_reduce_bytes = 4 * f.total_params * m;
  } else {
    const double local_experts = expert_params / static_cast<double>(ep);
    const double expert_replicas = static_cast<double>(dp / ep);
    const double shard = dp == 1 ? f.total_params : dense_params / static_cast<double>(dp) + local_experts / expert_replicas;
    s.params_updated = shard;
    // One rank: AdamW reads the gradients in place and writes the BF16 copy in the same pass.
    s.adamw_bytes = (dp == 1 ? 30 : 28) * shard - moments_saved * shard;
    s.optimizer_other_bytes = 4 * dense_params + (dp == 1 ? 0 : 6 * (dense_params + local_experts));
    s.expert_grad_accumulate_bytes = 4 * local_experts * (m - 1);
    if (dp > 1) {
      s.dense_grad_params = dense_params;
      s.dense_group = dp;
      s.expert_grad_params = local_experts;
      s.expert_group = dp / ep;
    }
    const double passes = 4 + (rc == Recompute::Block ? 1 : 0);
    s.dispatch_bytes = passes * moe_layers * m * s.tokens_per_microbatch * w.k * w.d * kActBytes *
                       static_cast<double>(ep - 1) / static_cast<double>(ep);
  }
  s.grad_norm_bytes = 4 * s.params_updated;

  // A pipeline stage holds its share of the layers (with the embedding or the LM head): its passes
  // scale with its share of the forward FLOPs, its optimizer, reduction and caches with its share
  // of the parameters.
  if (layout.pp > 1) {
    for (double* x : {&s.expert_flops, &s.dense_flops, &s.attention_flops, &s.recompute_flops, &s.fp8_dense_flops,
                      &s.elementwise_bytes, &s.fp8_quantize_bytes, &s.dispatch_bytes})
      *x *= stage_share;
    for (double* x : {&s.expert_grad_accumulate_bytes, &s.fp8_cache_bytes, &s.fp8_cache_in_adamw_bytes,
                      &s.adamw_bytes, &s.grad_norm_bytes,
                      &s.optimizer_other_bytes, &s.params_updated, &s.dense_grad_params, &s.expert_grad_params,
                      &s.fsdp_gather_bytes, &s.fsdp_reduce_bytes})
      *x *= param_share;
  }
  return s;
}

}  // namespace moe

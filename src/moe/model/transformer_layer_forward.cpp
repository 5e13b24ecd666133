// Transformer: the forward passes of one layer (attention, MoE, dense MLP) and recompute = block's
// rerun of them; the model-level passes that call them are in transformer.cpp.
#include "moe/model/transformer.h"

#include "moe/core/device.h"
#include "moe/ops/activation.h"
#include "moe/ops/elementwise.h"
#include "moe/ops/gemm.h"
#include "moe/ops/norm.h"
#include "moe/ops/rope.h"
#include "moe/ops/router.h"
#include "moe/ops/route.h"

namespace moe {
namespace {

// Linear layer y = x W^T (+= when accumulate).
void linear(Tensor y, Tensor x, Tensor w, bool accumulate = false) {
  matmul(y, x, w, false, true, 1.0f, accumulate ? 1.0f : 0.0f);
}
}  // namespace

// The attention block up to its output projection: input norm, q/k/v, qk-norm, RoPE, attention.
// Everything it writes is what recompute = attention drops (and rewrites here in backward).
void Transformer::attention_internals(const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A, Tensor h_in) {
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const int64_t Hq = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads, hd = cfg_.head_dim();
  const std::initializer_list<SharedInputLinear> qkv = {
      {A.q_raw, w.q_proj, &f.q_proj}, {A.k_raw, w.k_proj, &f.k_proj}, {A.v, w.v_proj, &f.v_proj}};
  if (f.q_proj.empty()) {
    rmsnorm_forward(A.a, A.rstd1, h_in, w.input_norm, eps);
    proj_->linear_shared_input(A.a, qkv);
  } else {  // FP8: the norm quantizes the projections' input as it writes it
    proj_->linear_shared_input(proj_->rmsnorm_rows(A.a, A.rstd1, h_in, w.input_norm, eps), qkv);
  }
  Tensor q = A.q_raw, k = A.k_raw;  // with qk_norm = none, rope rotates the projections in place
  if (cfg_.qk_norm == QkNorm::Full) {
    rmsnorm_forward(A.q, A.q_rstd, A.q_raw, w.q_norm, eps);
    rmsnorm_forward(A.k, A.k_rstd, A.k_raw, w.k_norm, eps);
    q = A.q, k = A.k;
  } else if (cfg_.qk_norm == QkNorm::PerHead) {
    rmsnorm_forward(A.q.view({rows_ * Hq, hd}), A.q_rstd, A.q_raw.view({rows_ * Hq, hd}), w.q_norm, eps);
    rmsnorm_forward(A.k.view({rows_ * Hkv, hd}), A.k_rstd, A.k_raw.view({rows_ * Hkv, hd}), w.k_norm, eps);
    q = A.q, k = A.k;
  }
  const float theta = static_cast<float>(cfg_.rope_theta);
  rope_forward(q, seq_len_, Hq, theta);
  rope_forward(k, seq_len_, Hkv, theta);
  attention_forward(A.att, A.lse, q, k, A.v, attn_shape_, s_.attn_ws);
}

void Transformer::attention_forward_layer(const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A,
                                          Tensor h_in) {
  attention_internals(w, f, A, h_in);
  copy(A.h_mid, h_in);
  proj_->linear(A.h_mid, A.att, w.o_proj, f.o_proj, /*accumulate=*/true);
}

// Moves the rows of the FFN norm output A.m to the experts (A.experts.expert_in): in the activation
// dtype, or (fp8_expert_input()) as the FP8 codes and scales the gate/up product reads.
void Transformer::dispatch_rows(LayerActs& A, const RoutePlan& plan) {
  const int K = static_cast<int>(cfg_.num_experts_per_tok);
  if (fp8_expert_input())
    dispatcher_.dispatch_fp8(A.experts.fp8_expert_in(), A.m, plan, K, {});
  else
    dispatcher_.dispatch(A.experts.expert_in, A.m, plan, K, {});
}

// gate/up of the routed experts from the dispatched rows; FP8 rows (fp8_expert_input()) are already
// the product's operand.
void Transformer::experts_gate_up(const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A) {
  if (fp8_expert_input())
    proj_->experts_forward(A.gu, A.experts.fp8_expert_in(), f.experts_gate_up, A.offsets);
  else
    proj_->experts_forward(A.gu, A.experts.expert_in, w.experts_gate_up, f.experts_gate_up, A.offsets);
}

// The routed experts on the dispatched rows (A.experts.expert_in): gate/up, SwiGLU and the down
// projection into A.experts.expert_out. gu and act are what recompute = experts drops.
void Transformer::expert_internals(const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A) {
  experts_gate_up(w, f, A);
  if (fp8_act_columns())
    proj_->experts_swiglu_forward(A.experts.expert_out, A.act_columns, A.gu, f.experts_down, A.offsets);
  else
    proj_->experts_swiglu_forward(A.experts.expert_out, A.act, A.gu, w.experts_down, f.experts_down, A.offsets);
}

// The shared expert's gate/up and SwiGLU (what its backward reads; recompute stops there). With
// h_out (the forward) also its down product, added into h_out: in FP8 the SwiGLU then writes that
// product's rows operand in its pass (Projections::swiglu_linear). mlp_internals likewise.
void Transformer::shared_expert_internals(const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A,
                                          Tensor h_out) {
  proj_->linear(A.shared_gu, A.m, w.shared_gate_up, f.shared_gate_up);
  ffn_swiglu(h_out, A.shared_act, A.shared_act_columns, A.shared_gu, w.shared_down, f.shared_down);
}

// In FP8 the SwiGLU writes its output's rows operand (for the down product) and its columns operand
// (kept for the down weight gradient) in one kernel and stores no output; recompute (no h_out)
// needs only the columns.
void Transformer::ffn_swiglu(Tensor h_out, Tensor act, const Fp8Tensor& act_columns, Tensor gu, Tensor w_down,
                             const Fp8Weight& f_down) {
  if (precision_ == Precision::FP8) {
    if (h_out.empty()) return proj_->swiglu_columns(act_columns, gu);
    return proj_->swiglu_linear(h_out, act_columns, gu, f_down, /*accumulate=*/true);
  }
  if (h_out.empty()) return swiglu_forward(act, gu);
  proj_->swiglu_linear(h_out, act, gu, w_down, f_down, /*accumulate=*/true);
}

void Transformer::ffn_down_backward(Tensor dact, Tensor dw, Tensor act, const Fp8Tensor& act_columns, Tensor w_down,
                                    const Fp8Weight& f_down) {
  if (precision_ == Precision::FP8)
    proj_->linear_backward(dact, dw, s_.dres, act_columns, f_down, /*accumulate_dx=*/false);
  else
    proj_->linear_backward(dact, dw, s_.dres, act, w_down, f_down, /*accumulate_dx=*/false);
}

// The post-attention norm. In an FP8 dense layer it also quantizes its output as the MLP's gate/up
// rows operand (returned, for mlp_internals next; empty otherwise). A MoE layer's readers of it are
// the router (BF16) and, through the dispatch, the experts; the shared expert reads it after the
// routed experts have reused the rows scratch, so it quantizes its own copy.
Fp8Tensor Transformer::ffn_norm(int64_t l, const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A) {
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  if (cfg_.is_moe_layer(l) || f.mlp_gate_up.empty()) {
    rmsnorm_forward(A.m, A.rstd2, A.h_mid, w.post_norm, eps);
    return {};
  }
  return proj_->rmsnorm_rows(A.m, A.rstd2, A.h_mid, w.post_norm, eps);
}

void Transformer::mlp_internals(const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A,
                                const Fp8Tensor& m_rows, Tensor h_out) {
  if (m_rows.codes.empty())
    proj_->linear(A.mlp_gu, A.m, w.mlp_gate_up, f.mlp_gate_up);
  else
    proj_->linear_shared_input(m_rows, {{A.mlp_gu, w.mlp_gate_up, &f.mlp_gate_up}});
  ffn_swiglu(h_out, A.mlp_act, A.mlp_act_columns, A.mlp_gu, w.mlp_down, f.mlp_down);
}

void Transformer::moe_forward_layer(int64_t l, const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A,
                                    Tensor h_out, uint64_t routing_seed, const RoutingState& rs) {
  const int64_t N = cfg_.num_experts, K = cfg_.num_experts_per_tok;
  linear(A.logits, A.m, w.router);
  Tensor bias = rs.router_bias.empty() ? Tensor() : rs.router_bias.rows(l, l + 1).view({N});
  router_forward(A.scores, A.topk_idx, A.topk_w, A.logits, bias, cfg_.router_score, cfg_.norm_topk_prob);
  if (cfg_.routing != Routing::Learned)  // benchmark routings: the router still runs (same cost), its choice is replaced
    synthetic_routing(A.topk_idx, A.topk_w, cfg_.routing == Routing::Random, N, routing_seed, l);
  route_counts(A.counts, A.topk_idx);
  router_losses(A.lb, A.z, A.counts, A.scores, A.logits, static_cast<int>(K), s_.router_ws);
  if (!rs.expert_load.empty()) accumulate_counts(rs.expert_load.rows(l, l + 1).view({N}), A.counts);
  const RoutePlan plan{A.route_index, A.offsets};
  if (recompute_ == Recompute::Block) {
    A.experts = dispatcher_.recompute_buffers();  // backward dispatches again: nothing to hold until then
  } else {
    A.lease = dispatcher_.acquire(static_cast<int>(l));
    A.leased = true;
    A.experts = A.lease.buffers;
  }
  dispatcher_.place_routes(static_cast<int>(l), plan, A.topk_idx, A.counts, {});
  dispatch_rows(A, plan);
  expert_internals(w, f, A);
  copy(h_out, A.h_mid);
  dispatcher_.combine(h_out, A.experts.expert_out, A.topk_w, plan, static_cast<int>(K), {});
  if (!w.shared_gate_up.empty()) shared_expert_internals(w, f, A, h_out);
}

void Transformer::mlp_forward_layer(const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A, Tensor h_out,
                                    const Fp8Tensor& m_rows) {
  copy(h_out, A.h_mid);
  mlp_internals(w, f, A, m_rows, h_out);
}

// recompute = block: everything layer l's backward reads, computed again from its input h(l) and
// its saved routing decision. The layer's output h(l+1) is not written again (the next layer's
// backward has already read it). The router runs again only for the logits and scores its
// backward reads; its choice lands in scratch and is not used, because the saved one (which may
// have come from the balancing bias or a benchmark routing) is what forward dispatched. The rows
// are dispatched again with the saved route index, which makes the same collective calls on every
// rank of the EP group in the same order.
void Transformer::recompute_layer(int64_t l, const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A) {
  attention_forward_layer(w, f, A, h(l));
  const Fp8Tensor m_rows = ffn_norm(l, w, f, A);
  if (!cfg_.is_moe_layer(l)) {
    mlp_internals(w, f, A, m_rows);
    return;
  }
  linear(A.logits, A.m, w.router);
  router_forward(A.scores, s_.recompute_topk_idx, s_.recompute_topk_w, A.logits, Tensor(), cfg_.router_score,
                 cfg_.norm_topk_prob);
  dispatch_rows(A, RoutePlan{A.route_index, A.offsets});
  expert_internals(w, f, A);  // the combine backward (weights' gradient) reads the expert outputs
  if (!w.shared_gate_up.empty()) shared_expert_internals(w, f, A);
}

}  // namespace moe

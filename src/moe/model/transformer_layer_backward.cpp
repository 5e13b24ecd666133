// Transformer: the backward passes of one layer (attention, MoE, dense MLP); the model-level
// backward that calls them (from the LM head down) is in transformer.cpp.
#include "moe/model/transformer.h"

#include "moe/core/device.h"
#include "moe/ops/activation.h"
#include "moe/ops/elementwise.h"
#include "moe/ops/gemm.h"
#include "moe/ops/norm.h"
#include "moe/ops/permute.h"
#include "moe/ops/rope.h"
#include "moe/ops/router.h"

namespace moe {
namespace {

// Backward of y = x W^T: dx (= or +=) dy W, dW += dy^T x.
void linear_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, bool accumulate_dx) {
  matmul(dx, dy, w, false, false, 1.0f, accumulate_dx ? 1.0f : 0.0f);
  matmul(dw, dy, x, true, false, 1.0f, 1.0f);
}

}  // namespace

void Transformer::attention_backward_layer(const LayerWeights& w, const Fp8LayerWeights& f, const LayerWeights& g,
                                           LayerActs& A, Tensor h_in, bool recompute) {
  // s_.dres holds d(h_mid); it flows unchanged into d(h_in) plus the attention branch.
  const int64_t Hq = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads, hd = cfg_.head_dim();
  Scratch& s = s_;
  if (recompute && recompute_ == Recompute::Attention) attention_internals(w, f, A, h_in);
  proj_->linear_backward(s.datt, g.o_proj, s.dres, A.att, w.o_proj, f.o_proj, false);
  const bool normed = cfg_.qk_norm != QkNorm::None;
  Tensor q = normed ? A.q : A.q_raw, k = normed ? A.k : A.k_raw;
  attention_backward(s.dq, s.dk, s.dv, s.datt, q, k, A.v, A.att, A.lse, attn_shape_, s.attn_ws);
  const float theta = static_cast<float>(cfg_.rope_theta);
  rope_backward(s.dq, seq_len_, Hq, theta);
  rope_backward(s.dk, seq_len_, Hkv, theta);
  Tensor dq_raw = s.dq, dk_raw = s.dk;
  if (cfg_.qk_norm == QkNorm::Full) {
    rmsnorm_backward(s.dq_raw, g.q_norm, s.dq, A.q_raw, w.q_norm, A.q_rstd, false);
    rmsnorm_backward(s.dk_raw, g.k_norm, s.dk, A.k_raw, w.k_norm, A.k_rstd, false);
    dq_raw = s.dq_raw, dk_raw = s.dk_raw;
  } else if (cfg_.qk_norm == QkNorm::PerHead) {
    rmsnorm_backward(s.dq_raw.view({rows_ * Hq, hd}), g.q_norm, s.dq.view({rows_ * Hq, hd}),
                     A.q_raw.view({rows_ * Hq, hd}), w.q_norm, A.q_rstd, false);
    rmsnorm_backward(s.dk_raw.view({rows_ * Hkv, hd}), g.k_norm, s.dk.view({rows_ * Hkv, hd}),
                     A.k_raw.view({rows_ * Hkv, hd}), w.k_norm, A.k_rstd, false);
    dq_raw = s.dq_raw, dk_raw = s.dk_raw;
  }
  proj_->linear_backward_shared_input(
      s.da, A.a,
      {{g.q_proj, dq_raw, w.q_proj, &f.q_proj}, {g.k_proj, dk_raw, w.k_proj, &f.k_proj},
       {g.v_proj, s.dv, w.v_proj, &f.v_proj}},
      /*accumulate_dx=*/false);
  rmsnorm_backward(s.dres, g.input_norm, s.da, h_in, w.input_norm, A.rstd1, /*accumulate_dx=*/true);
}

void Transformer::moe_backward_layer(const LayerWeights& w, const Fp8LayerWeights& f, const LayerWeights& g,
                                     LayerActs& A, const StepScales& scales, bool recompute) {
  const int K = static_cast<int>(cfg_.num_experts_per_tok);
  Scratch& s = s_;
  // recompute = experts: gate/up again from the kept expert input (the lease's); the SwiGLU output
  // comes out of the SwiGLU backward below, in the same pass, with the forward's bits.
  const bool recompute_experts = recompute && recompute_ == Recompute::Experts;
  if (recompute_experts) {
    experts_gate_up(w, f, A);
    if (!w.shared_gate_up.empty()) shared_expert_internals(w, f, A);  // from the kept FFN norm output
  }
  const RoutePlan plan{A.route_index, A.offsets};
  // d.expert_out = dye (empty when gathered_expert_grads_), d.expert_in = dxe
  const ExpertBuffers d = dispatcher_.grad_buffers();
  ExpertOutputGrad dye;
  if (gathered_expert_grads_) {
    // Every route is this rank's: d(expert output) row r is topk_w[i] * dres[t] of its route i,
    // quantized from dres into the down product's operands without being stored.
    invert_route_index(s.route_of_row, A.route_index);
    combine_rows_weight_grad(s.dw, s.dres, A.experts.expert_out, A.route_index, K);
    dye = proj_->experts_data_grad(s.dact, GatheredRows{s.dres, s.route_of_row, A.topk_w, K}, f.experts_down,
                                   A.offsets);
  } else {
    dispatcher_.combine_backward(d.expert_out, s.dw, s.dres, A.experts.expert_out, A.topk_w, plan, K, {});
    dye = proj_->experts_data_grad(s.dact, d.expert_out, w.experts_down, f.experts_down, A.offsets);
  }
  const bool accumulate = !scales.gradients_zeroed;  // equal results: 0 + x == x
  if (recompute_experts) swiglu_backward_with_output(s.dgu, A.act, s.dact, A.gu);
  if (fp8_act_columns())
    proj_->experts_weight_grad(g.experts_down, dye, A.act_columns, f.experts_down, A.offsets, accumulate);
  else
    proj_->experts_weight_grad(g.experts_down, dye, A.act, f.experts_down, A.offsets, accumulate);
  // d(gate/up) and its data gradient after the down weight gradient: in FP8 the SwiGLU backward
  // quantizes d(gate/up) into the operand scratch that held dye's columns (s.dgu is then not
  // reserved). With recompute = experts, d(gate/up) came with the SwiGLU output above.
  const ExpertOutputGrad dgu =
      recompute_experts
          ? proj_->experts_data_grad(d.expert_in, s.dgu, w.experts_gate_up, f.experts_gate_up, A.offsets)
          : proj_->experts_swiglu_data_grad(d.expert_in, s.dgu, s.dact, A.gu, w.experts_gate_up, f.experts_gate_up,
                                            A.offsets);
  if (fp8_expert_input()) {
    // The weight gradient reads the expert input along the tokens: quantized from the FFN norm
    // output the rows copy (gathered_expert_grads_), or re-quantized from the moved FP8 rows (payload
    // fp8). All reads of the moved rows stay before dispatch_backward's syncs, after which a peer may
    // store into them again.
    const Fp8Tensor x_columns =
        gathered_expert_grads_ ? proj_->expert_input_columns(GatheredRows{A.m, s.route_of_row, {}, K}, A.offsets)
                               : proj_->expert_input_columns(A.experts.fp8_expert_in(), act_, A.offsets);
    proj_->experts_weight_grad(g.experts_gate_up, dgu, x_columns, f.experts_gate_up, A.offsets, accumulate);
  } else {
    proj_->experts_weight_grad(g.experts_gate_up, dgu, A.experts.expert_in, f.experts_gate_up, A.offsets,
                               accumulate);
  }
  dispatcher_.dispatch_backward(s.dm, d.expert_in, plan, K, {});
  if (A.leased) {
    dispatcher_.release(A.lease);  // last read of this layer's expert buffers
    A.leased = false;
  }
  if (!w.shared_gate_up.empty()) {
    const int64_t S = cfg_.shared_expert_intermediate_size;
    Tensor dact = Tensor(s.dffn_act.data, act_, {rows_, S}, dev_);
    // Written only in BF16 (FP8 quantizes d(gate/up) as it computes it; the scratch is not planned).
    const Tensor dgu = s.dffn_gu.empty() ? Tensor() : Tensor(s.dffn_gu.data, act_, {rows_, 2 * S}, dev_);
    ffn_down_backward(dact, g.shared_down, A.shared_act, A.shared_act_columns, w.shared_down, f.shared_down);
    proj_->swiglu_linear_backward(s.dm, g.shared_gate_up, dgu, dact, A.shared_gu, A.m, w.shared_gate_up,
                                  f.shared_gate_up, /*accumulate_dx=*/true);
  }
  if (cfg_.routing == Routing::Learned) {
    const float lb_scale = static_cast<float>(cfg_.router_aux_loss_coef) * scales.aux_grad_scale;
    const float z_scale = static_cast<float>(cfg_.router_z_loss_coef) * scales.aux_grad_scale;
    router_backward(s.dlogits, s.dw, A.topk_idx, A.topk_w, A.scores, A.logits, A.counts, lb_scale, z_scale,
                    cfg_.router_score, cfg_.norm_topk_prob);
    // The router's matrix products run in the activation dtype: d(logits) is rounded once.
    Tensor dlogits = s.dlogits;
    if (act_ != DType::F32) {
      cast_copy(s.dlogits_act, s.dlogits);
      dlogits = s.dlogits_act;
    }
    linear_backward(s.dm, g.router, dlogits, A.m, w.router, true);
  }
}

void Transformer::mlp_backward_layer(const LayerWeights& w, const Fp8LayerWeights& f, const LayerWeights& g,
                                     LayerActs& A) {
  const int64_t Hd = cfg_.dense_intermediate_size;
  Scratch& s = s_;
  Tensor dact = Tensor(s.dffn_act.data, act_, {rows_, Hd}, dev_);
  const Tensor dgu = s.dffn_gu.empty() ? Tensor() : Tensor(s.dffn_gu.data, act_, {rows_, 2 * Hd}, dev_);
  ffn_down_backward(dact, g.mlp_down, A.mlp_act, A.mlp_act_columns, w.mlp_down, f.mlp_down);
  proj_->swiglu_linear_backward(s.dm, g.mlp_gate_up, dgu, dact, A.mlp_gu, A.m, w.mlp_gate_up, f.mlp_gate_up,
                                /*accumulate_dx=*/false);
}

}  // namespace moe

// The performance model's arithmetic on a config small enough to count by hand: each part's time
// is its work over (peak x efficiency), with the work written out here from the formulas
// step_work.h and step_model.h state (not from the code under test), on one GPU, with EP and data
// parallelism on one node, across two nodes, and with a pipeline.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "moe/core/error.h"
#include "moe/perf/step_model.h"
#include "moe/train/pipeline_layout.h"
#include "moe/train/step_work.h"

namespace moe {
namespace {

// A GPU with round numbers and every efficiency 0.5.
HardwareProfile round_gpu() {
  HardwareProfile p;
  p.name = "round";
  p.peak_bf16_tflops = 100, p.peak_fp8_tflops = 200, p.memory_tb_s = 1, p.memory_gib = 80;
  p.gpus_per_node = 8, p.intra_node_gb_s = 100, p.inter_node_gb_s = 10;
  for (const auto& [key, c] : p.curves()) c->points = {{1, 0.5}};
  return p;
}

// d 64, 2 layers of 4 heads (head dim 16), experts of hidden 128, top-2 of 8, vocab 512; 8 x 128
// tokens per microbatch, 16 sequences per step.
Config tiny() {
  Config c;
  ModelConfig& m = c.model;
  m.vocab_size = 512, m.hidden_size = 64, m.num_hidden_layers = 2, m.num_attention_heads = 4;
  m.num_key_value_heads = 4, m.intermediate_size = 128, m.num_experts = 8, m.num_experts_per_tok = 2;
  m.qk_norm = QkNorm::None, m.shared_expert_intermediate_size = 0, m.first_k_dense_replace = 0;
  c.train.micro_batch_size = 8, c.train.global_batch_size = 16, c.train.seq_len = 128;
  return c;
}

constexpr double d = 64, L = 2, h = 128, N = 8, K = 2, V = 512, S = 128, q = 64, kv = 64;
constexpr double expert_params = L * N * 3 * d * h;
constexpr double dense_params = 2 * V * d + d + L * (d * (q + 2 * kv) + q * d + 2 * d + d * N);
constexpr double peak = 100e12 * 0.5, mem = 1e12 * 0.5, nvlink = 100e9 * 0.5, network = 10e9 * 0.5;

Topology topology(int64_t gpus, int64_t nodes, const std::string& mode, int64_t ep, int64_t pp = 1) {
  Topology t;
  t.gpus = gpus, t.nodes = nodes;
  t.layout.world = gpus, t.layout.mode = mode, t.layout.ep = ep, t.layout.pp = pp;
  return t;
}

double part(const StepPrediction& p, const std::string& name) {
  for (const PredictedPart& x : p.parts)
    if (x.name == name) return x.seconds;
  ADD_FAILURE() << "no part " << name;
  return -1;
}

TEST(StepModel, one_gpu_parts_are_work_over_peak_times_efficiency) {
  const StepPrediction p = predict_step(tiny(), topology(1, 1, "ddp", 1), round_gpu());
  const double T = 2048, m = 2;  // two microbatches of 1024 tokens
  EXPECT_NEAR(part(p, "expert GEMMs"), (6 * K * 3 * d * h * L * T) / peak + 4 * expert_params * (m - 1) / mem, 1e-15);
  const double dense_per_token = L * (d * (q + 2 * kv) + q * d + d * N) + d * V;
  EXPECT_NEAR(part(p, "dense GEMMs"), 6 * dense_per_token * T / peak, 1e-15);
  EXPECT_NEAR(part(p, "attention"), 12 * L * S * q * T / peak, 1e-15);
  // Element-wise passes per token (BF16, 2 bytes): attention forward 2d + 2(q+kv) + 2d + 2d, backward
  // 2(q+kv) + 4d + 4d; MoE forward 2Kd + 3Kh + Kd + d + 2d (+ 8N bytes of router scores), backward
  // d + 2Kd + 5Kh + Kd + d (+ 12N); head 6d + 2d (+ 12V + 10d bytes).
  const double layer = 2 * (2 * d + 2 * (q + kv) + 2 * d + 2 * d) + 2 * (2 * (q + kv) + 4 * d + 4 * d) +
                       2 * (2 * K * d + 3 * K * h + K * d + d + 2 * d) + 8 * N +
                       2 * (d + 2 * K * d + 5 * K * h + K * d + d) + 12 * N;
  const double elementwise = (L * layer + 2 * (6 * d + 2 * d) + 12 * V + 10 * d) * T;
  EXPECT_NEAR(part(p, "element-wise, routing"), elementwise / mem, 1e-15);
  // One rank: AdamW 30 bytes per parameter, the norm 4, the dense gradients zeroed (4).
  const double params = expert_params + dense_params;
  EXPECT_NEAR(part(p, "optimizer"), (34 * params + 4 * dense_params) / mem, 1e-15);
  for (const char* none : {"gradient reduction", "dispatch/combine", "FSDP gathers", "pipeline bubble", "FP8 quantize"})
    EXPECT_EQ(part(p, none), 0) << none;
  double sum = 0;
  for (const PredictedPart& x : p.parts) sum += x.seconds;
  EXPECT_NEAR(p.step_s, sum, 1e-15);
  EXPECT_NEAR(p.tokens_per_s_per_gpu, T / sum, 1e-6);
  // MFU: the trainer's FLOPs per token (6 x matrix parameters per token + attention) at the peak.
  const double flops_per_token = 6 * (dense_per_token + K * 3 * d * h * L) + 12 * L * S * q;
  EXPECT_NEAR(p.mfu, flops_per_token * (T / sum) / 100e12, 1e-12);
}

TEST(StepModel, ep_moves_rows_over_nvlink_and_reduces_dense_gradients_in_a_ring) {
  const StepPrediction p = predict_step(tiny(), topology(2, 1, "ddp", 2), round_gpu());
  const double T = 1024;  // one microbatch per rank
  // Dispatch, combine and their backward: 4 passes of T K rows of d BF16, half of them to the other GPU.
  EXPECT_NEAR(part(p, "dispatch/combine"), 4 * L * T * K * d * 2 * 0.5 / nvlink, 1e-15);
  // Dense gradients: F32 reduce-scatter + all-gather over 2 ranks; the expert slices have no replica.
  EXPECT_NEAR(part(p, "gradient reduction"), 2 * 4 * dense_params * 0.5 / nvlink, 1e-15);
  // Each rank updates half the dense parameters and its own experts: 28 + 4 bytes, plus the BF16
  // refresh (6) of what it holds and the dense gradients zeroed (4).
  const double shard = dense_params / 2 + expert_params / 2;
  EXPECT_NEAR(part(p, "optimizer"), (32 * shard + 6 * (dense_params + expert_params / 2) + 4 * dense_params) / mem,
              1e-15);
}

TEST(StepModel, a_ring_across_nodes_runs_at_the_network_rate) {
  Config c = tiny();
  c.train.global_batch_size = 128;  // one microbatch on each of 16 ranks
  const StepPrediction p = predict_step(c, topology(16, 2, "ddp", 8), round_gpu());
  // Dense gradients over 16 ranks, each expert slice over its 2 replicas: both rings span the nodes.
  const double bytes = 2 * 4 * dense_params * 15.0 / 16 + 2 * 4 * (expert_params / 8) * 0.5;
  EXPECT_NEAR(part(p, "gradient reduction"), bytes / network, 1e-15);
  EXPECT_NEAR(part(p, "dispatch/combine"), 4 * L * 1024 * K * d * 2 * 7.0 / 8 / nvlink, 1e-15);
}

TEST(StepModel, fsdp_gathers_every_block_in_bf16_and_reduces_f32_gradients) {
  const StepPrediction p = predict_step(tiny(), topology(2, 1, "fsdp", 1), round_gpu());
  const double params = expert_params + dense_params;
  // Forward gathers every block, backward every block but the embedding; gradients reduce-scattered.
  const double bytes = (2 * (2 * params - V * d) + 4 * params) * 0.5;
  EXPECT_NEAR(part(p, "FSDP gathers"), bytes / nvlink, 1e-15);
  EXPECT_EQ(part(p, "dispatch/combine"), 0);
  EXPECT_EQ(part(p, "gradient reduction"), 0);
}

TEST(StepModel, a_pipeline_idles_p_minus_1_over_m_of_its_forward_and_backward) {
  const StepPrediction one = predict_step(tiny(), topology(1, 1, "ddp", 1), round_gpu());
  const StepPrediction p = predict_step(tiny(), topology(2, 1, "ddp", 1, /*pp=*/2), round_gpu());
  // Two stages of one layer each, the same 2 microbatches: each stage does half of the one-GPU work.
  double compute = 0;
  for (const PredictedPart& x : p.parts)
    if (x.name != "optimizer" && x.name != "gradient reduction" && x.name != "pipeline bubble") compute += x.seconds;
  EXPECT_NEAR(part(p, "expert GEMMs"), part(one, "expert GEMMs") / 2, 1e-15);
  EXPECT_NEAR(part(p, "pipeline bubble"), compute * (2 - 1) / 2.0, 1e-15);
  // Per GPU: the replica's 2048 tokens over two GPUs.
  EXPECT_NEAR(p.tokens_per_s_per_gpu, 1024 / p.step_s, 1e-6);
}

// Recompute repeats the forward products of what it drops, except the top layer's without a
// pipeline (its backward follows its own forward: model/recompute.h): of tiny's 2 MoE layers,
// experts repeats one layer's gate/up products (2 K d 2h per token) and attention one layer's
// q/k/v products and attention scores (2 d (q + 2 kv) + 4 S q per token); under pp = 2 every layer
// is counted, scaled by the stage's share.
TEST(StepModel, recompute_repeats_every_layer_but_the_top_one_without_pipeline) {
  const double T = 16 * S;
  Config c = tiny();
  c.train.recompute = Recompute::Experts;
  EXPECT_DOUBLE_EQ(step_work(c, rank_layout(c, 1)).recompute_flops, (L - 1) * 2 * K * d * 2 * h * T);
  c.train.recompute = Recompute::Attention;
  EXPECT_DOUBLE_EQ(step_work(c, rank_layout(c, 1)).recompute_flops,
                   (L - 1) * (2 * d * (q + 2 * kv) + 4 * S * q) * T);
  c.train.recompute = Recompute::Experts;
  c.parallel.pp = 2;
  const RankLayout stages = rank_layout(c, 2);
  EXPECT_NEAR(step_work(c, stages).recompute_flops, L * 2 * K * d * 2 * h * T * stages.stage_share, 1e-6);
}

// The FP8 quantize kernels' bytes, listed kernel by kernel for one MoE layer of the tiny model
// (2 bytes read and 1 written per element quantized by rows or by columns, 2 and 2 for an output
// gradient in both layouts, 4 and 3 per unit of the quantizing SwiGLU forward, 6 and 4 per unit of
// the SwiGLU backward that quantizes d(gate/up), 1 and 1 re-quantizing FP8 rows): what the step
// split's "FP8 quantize" row times. The element-wise bytes lose the SwiGLU forward and the
// quantizing SwiGLU backward (timed there) and gain the FP8 codes the attention RMSNorm writes. At EP 1 every
// route stays on the rank: the scatter writes FP8 rows (as with payload fp8), the expert backward's
// operands are gathered from the token rows (the same bytes as from stored rows) and the combine
// backward stores no d(expert output); at EP 2 the experts quantize the BF16 rows they receive.
TEST(StepModel, fp8_quantize_bytes_are_what_the_quantize_kernels_move) {
  const double T = 16 * S;
  struct Pass {
    const char* what;
    double elements, bytes_per_element;
  };
  // act_columns (recompute is not experts): the routed SwiGLU forward writes its output's rows and
  // columns in FP8 only (gate/up read, 4 bytes per unit; 2 written) and the backward has no columns
  // pass of its own; under recompute = experts the forward keeps the BF16 output (7) and the
  // backward quantizes its columns (3), and the plain SwiGLU backward (element-wise) writes
  // d(gate/up) for its own rows-and-columns pass (4 per element of 2 h).
  // fused_backward: the SwiGLU backward quantizes d(gate/up) (act_columns, and the top MoE layer
  // that recompute = experts does not recompute).
  auto layer_bytes = [&](bool scatter_fp8, bool payload_fp8, bool act_columns = true, bool fused_backward = true) {
    const std::vector<Pass> passes = {
        {"o's input rows (forward)", q, 3},
        {"o's input columns", q, 3},
        {"o's output gradient, rows and columns", d, 4},
        {"q, k, v output gradients, rows and columns", q + 2 * kv, 4},
        {"the attention norm output's columns (q, k, v)", d, 3},
        {"the experts' input rows (BF16 rows received; an FP8 scatter quantizes itself)", scatter_fp8 ? 0 : K * d, 3},
        {"the experts' SwiGLU forward with its output's FP8 layouts", K * h, act_columns ? 6.0 : 7.0},
        {"down's output gradient, rows and columns (stored or gathered)", K * d, 4},
        {"the SwiGLU output's columns", act_columns ? 0 : K * h, 3},
        {"gate/up's output gradient, rows and columns (fused_backward: the SwiGLU backward writes them)",
         K * h, fused_backward ? 10.0 : 8.0},
        {"the experts' input columns (payload fp8: re-quantized from FP8 rows)", K * d, payload_fp8 ? 2.0 : 3.0},
    };
    double sum = 0;
    for (const Pass& p : passes) sum += p.elements * p.bytes_per_element;
    return sum;
  };
  for (int64_t ep : {1, 2}) {
    Config c = tiny();
    c.parallel.ep = ep;
    const double Tr = T / static_cast<double>(ep);  // tokens per rank: ep ranks of data parallelism
    const bool local = ep == 1;
    const StepWork bf16 = step_work(c, rank_layout(c, ep));
    c.train.precision = Precision::FP8;
    const StepWork fp8 = step_work(c, rank_layout(c, ep));
    EXPECT_DOUBLE_EQ(fp8.fp8_quantize_bytes, L * Tr * layer_bytes(local, false)) << "ep " << ep;
    // Locally: the FP8 scatter writes K d one-byte codes where the BF16 one writes two bytes each,
    // and the combine backward no 2-byte d(expert output) rows.
    // The quantizing SwiGLU backward's 5 K h two-byte elements are timed as FP8 quantize.
    EXPECT_DOUBLE_EQ(fp8.elementwise_bytes, bf16.elementwise_bytes + L * Tr * d - L * Tr * 2 * 3 * K * h -
                                                L * Tr * 2 * 5 * K * h - (local ? L * Tr * (K * d + 2 * K * d) : 0))
        << "ep " << ep;
    c.ep.payload = Payload::FP8;
    const StepWork payload = step_work(c, rank_layout(c, ep));
    EXPECT_DOUBLE_EQ(payload.fp8_quantize_bytes, L * Tr * layer_bytes(true, true)) << "ep " << ep;
    // The combine backward stores d(expert output) again (the payload moves it in BF16).
    EXPECT_DOUBLE_EQ(payload.elementwise_bytes, bf16.elementwise_bytes + L * Tr * d - L * Tr * 2 * 3 * K * h -
                                                    L * Tr * 2 * 5 * K * h - L * Tr * K * d)
        << "ep " << ep;
    c.ep.payload = Payload::BF16;
    // Recompute = experts: the gate/up input rows again in every MoE layer but the top one (none
    // locally: the FP8 rows are kept); the top one, not recomputed, runs the quantizing SwiGLU
    // backward.
    c.train.recompute = Recompute::Experts;
    const StepWork experts = step_work(c, rank_layout(c, ep));
    EXPECT_DOUBLE_EQ(experts.fp8_quantize_bytes, (L - 1) * Tr * layer_bytes(local, false, false, false) +
                                                     Tr * layer_bytes(local, false, false, true) +
                                                     (local ? 0 : (L - 1) * Tr * K * d * 3))
        << "ep " << ep;
  }
}

// The same listing for a model with a dense first layer and a shared expert, with each recompute
// mode: block repeats o's input rows, the experts' input rows, every SwiGLU (FP8 layouts) and the
// shared expert's input rows; experts repeats the input rows and the shared expert's SwiGLU (below
// the top MoE layer); attention quantizes only inside its RMSNorm (element-wise: d codes per
// recomputed layer).
TEST(StepModel, fp8_quantize_bytes_cover_shared_experts_dense_layers_and_recompute) {
  const double T = 16 * S, Ls = 3, dense = 1, moe = Ls - dense, s = 32, hd = 96;
  Config c = tiny();
  c.model.num_hidden_layers = 3, c.model.first_k_dense_replace = 1;
  c.model.shared_expert_intermediate_size = 32, c.model.dense_intermediate_size = 96;
  const double attention = 3 * q + 3 * q + 4 * d + 4 * (q + 2 * kv) + 3 * d;
  // input rows (forward), fused SwiGLU, down and gate/up output gradients, SwiGLU output columns,
  // input columns; every SwiGLU writes both FP8 layouts itself, forward and backward, except the
  // routed experts' under recompute = experts (act_columns), whose backward quantizes d(gate/up)
  // only in the top MoE layer, the one not recomputed (fused_backward).
  auto mlp = [&](double units, double input_rows, bool act_columns = true, bool fused_backward = true) {
    return input_rows + (act_columns ? 6 * units : 7 * units + 3 * units) + 4 * d +
           (fused_backward ? 10 : 8) * units + 3 * d;
  };
  // EP 1 (every route on the rank): the scatter writes the experts' FP8 input rows (no rows pass,
  // none again under recompute; element-wise K d codes per dispatch) and the combine backward no
  // d(expert output) (2 K d); EP 2: the experts quantize the rows they receive.
  for (int64_t ep : {1, 2})
    for (Recompute rc : {Recompute::None, Recompute::Block, Recompute::Experts, Recompute::Attention}) {
      const bool act_columns = rc != Recompute::Experts, local = ep == 1;
      const double Tr = T / static_cast<double>(ep), rows = local ? 0 : 3 * d;
      const double routed = act_columns ? moe * mlp(h, rows)
                                        : (moe - 1) * mlp(h, rows, false, false) + mlp(h, rows, false, true);
      const double per_step = Tr * (Ls * attention + K * routed + moe * mlp(s, 3 * d) + dense * mlp(hd, 0));
      c.parallel.ep = ep;
      c.train.recompute = rc;
      c.train.precision = Precision::BF16;
      const StepWork bf16 = step_work(c, rank_layout(c, ep));
      c.train.precision = Precision::FP8;
      const StepWork fp8 = step_work(c, rank_layout(c, ep));
      double again = 0, norms = Ls + dense, swiglu = moe * (K * h + s) + dense * hd, dispatches = 1;
      // The quantizing SwiGLU backwards (5 two-byte elements per unit) are timed as FP8 quantize.
      const double swiglu_backward = moe * ((act_columns ? K * h : 0) + s) + (act_columns ? 0 : K * h) + dense * hd;
      if (rc == Recompute::Block) {
        again = Tr * (Ls * 3 * q + moe * (K * (rows + 6 * h) + 3 * d + 6 * s) + dense * 6 * hd);
        norms += Ls + dense, swiglu += moe * (K * h + s) + dense * hd, dispatches = 2;
      } else if (rc == Recompute::Experts) {
        again = Tr * (moe - 1) * (K * rows + 3 * d + 6 * s);
        swiglu += (moe - 1) * s;
      } else if (rc == Recompute::Attention) {
        norms += Ls - 1;
      }
      const double local_bytes = local ? Tr * moe * (dispatches * K * d + 2 * K * d) : 0;
      EXPECT_DOUBLE_EQ(fp8.fp8_quantize_bytes, per_step + again) << "ep " << ep << ", " << static_cast<int>(rc);
      EXPECT_NEAR(fp8.elementwise_bytes,
                  bf16.elementwise_bytes + Tr * norms * d - Tr * 2 * 3 * swiglu - Tr * 2 * 5 * swiglu_backward -
                      local_bytes,
                  1e-9 * bf16.elementwise_bytes)
          << "ep " << ep << ", " << static_cast<int>(rc);
    }
}

// A run's own layout (rank_layout): the trainer's stage boundaries, balanced by per-layer cost with
// the embedding and the LM head counted, are uneven (the head weighs on the last stage). The
// passes scale with the heaviest stage's share of the forward FLOPs, the optimizer and the
// reduction with the largest share of the parameters (the embedding's on the first stage, the
// head's on the last); the interleaved schedule's bubble is (P - 1) / (V m).
TEST(StepModel, a_run_with_pipeline_stages_is_predicted_at_its_heaviest_stages_shares) {
  Config c = tiny();
  c.model.num_hidden_layers = 4;
  c.parallel.pp = 2;
  const RankLayout layout = rank_layout(c, 2);
  EXPECT_EQ(layout.pp, 2);
  const PipelineLayout stages = plan_pipeline_layout(c.model, S, 2, 1);
  double cost[2] = {embedding_cost(c.model), head_cost(c.model)};
  for (int64_t l = 0; l < 4; ++l) cost[l < stages.end_layer(0) ? 0 : 1] += layer_cost(c.model, S, l);
  const double share = std::max(cost[0], cost[1]) / (cost[0] + cost[1]);
  EXPECT_GT(share, 0.5);
  EXPECT_NEAR(layout.stage_share, share, 1e-12);
  // Parameters per layer: attention d (q + 2 kv) + q d, two norms, router d N, experts N 3 d h.
  const double per_layer = d * (q + 2 * kv) + q * d + 2 * d + d * N + N * 3 * d * h;
  const double layers0 = static_cast<double>(stages.end_layer(0));
  const double params[2] = {V * d + layers0 * per_layer, (4 - layers0) * per_layer + V * d + d};
  const double param_share = std::max(params[0], params[1]) / (params[0] + params[1]);
  EXPECT_NEAR(layout.stage_param_share, param_share, 1e-12);
  EXPECT_NEAR(rank_layout(c, 2, /*stage=*/0).stage_share, cost[0] / (cost[0] + cost[1]), 1e-12);

  Config whole = c;
  whole.parallel.pp = 1;
  RankLayout one_rank = rank_layout(whole, 1);
  const StepWork w = step_work(c, layout), w1 = step_work(whole, one_rank);
  EXPECT_NEAR(w.expert_flops, w1.expert_flops * share, 1e-9 * w1.expert_flops);
  EXPECT_NEAR(w.attention_flops, w1.attention_flops * share, 1e-9 * w1.attention_flops);
  EXPECT_NEAR(w.adamw_bytes, w1.adamw_bytes * param_share, 1e-9 * w1.adamw_bytes);
  EXPECT_NEAR(w.params_updated, w1.params_updated * param_share, 1e-9 * w1.params_updated);
  Topology t = topology(2, 1, "ddp", 1);
  t.layout = layout;
  const StepPrediction p = predict_step(c, t, round_gpu());
  EXPECT_EQ(part(p, "gradient reduction"), 0);  // one data-parallel rank per stage

  c.parallel.pp_schedule = "interleaved";
  c.parallel.pp_virtual = 2;
  t.layout = rank_layout(c, 2);
  const StepPrediction v = predict_step(c, t, round_gpu());
  double compute = 0;
  for (const PredictedPart& x : v.parts)
    if (x.name != "optimizer" && x.name != "gradient reduction" && x.name != "pipeline bubble") compute += x.seconds;
  EXPECT_NEAR(part(v, "pipeline bubble"), compute * (2 - 1) / (2 * 2.0), 1e-15);
}

TEST(StepModel, topologies_the_hardware_cannot_hold_are_refused_with_what_to_change) {
  const HardwareProfile hw = round_gpu();
  auto message = [&](const Topology& t) {
    try {
      predict_step(tiny(), t, hw);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message(topology(16, 1, "ddp", 1)).find("use --nodes 2"), std::string::npos);
  EXPECT_NE(message(topology(6, 4, "ddp", 1)).find("cannot be spread evenly"), std::string::npos);
  EXPECT_NE(message(topology(8, 2, "ddp", 8)).find("an EP group must stay inside a node"), std::string::npos);
  EXPECT_NE(message(topology(4, 1, "ddp", 1)).find("train.global_batch_size = 16 is not a multiple"), std::string::npos)
      << message(topology(4, 1, "ddp", 1));  // 16 sequences cannot be 8 per rank on 4 ranks
}

// The first line of a prediction names the shipped profile and says whether its efficiencies were
// measured on that GPU, as one phrase (it once read "(datasheet, efficiencies not measured on it
// profile)").
TEST(StepModel, every_shipped_profile_is_printed_by_its_name_and_how_far_it_is_measured) {
  const struct {
    const char* builtin;
    const char* label;
  } cases[] = {{"h200", "predicted step on H200 (measured profile): "},
               {"h100", "predicted step on H100 (measured profile): "},
               {"b200", "predicted step on B200 (datasheet profile, efficiencies not measured on this GPU): "},
               {"b300", "predicted step on B300 (datasheet profile, efficiencies not measured on this GPU): "}};
  ASSERT_EQ(builtin_hardware_names().size(), std::size(cases));
  for (const auto& c : cases) {
    const HardwareProfile hw = load_hardware_profile(c.builtin);
    const std::string text = format_prediction(predict_step(tiny(), topology(1, 1, "ddp", 1), hw), hw);
    EXPECT_EQ(text.rfind(c.label, 0), 0u) << c.builtin << ":\n" << text;
  }
}

// A profile built in code is not bounded as a file is: an efficiency of 5e-324 made the element-wise
// part inf s, and the prediction "inf s, 0 tokens/s per GPU" (null in --json). It is an error
// naming the part and the profile.
TEST(StepModel, a_profile_that_times_a_part_at_infinity_is_an_error_naming_the_part) {
  HardwareProfile hw = round_gpu();
  hw.elementwise.points = {{1, 5e-324}};
  std::string msg = "(no error)";
  try {
    predict_step(tiny(), topology(1, 1, "ddp", 1), hw);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("the performance model on round times 'element-wise, routing' at inf s"), std::string::npos)
      << msg;
}

// Every line of the split is printed whole, however long its numbers: the line buffer's remaining
// size was computed from snprintf's would-be length, so a 1e300 ms part (1e-300 TFLOP/s, before
// profile files had floors) wrapped it past the end and the next write overran the stack.
TEST(StepModel, a_split_line_with_huge_numbers_is_printed_whole) {
  const HardwareProfile hw = round_gpu();
  StepPrediction p;
  p.parts = {{"element-wise, routing", 1e300, 6e7, "B", 0.5}, {"expert GEMMs", 1e298, 1e300, "FLOP", 0.25}};
  p.step_s = 1.01e300, p.tokens_per_s_per_gpu = 1e-297, p.mfu = 1e-300;
  const std::string text = format_prediction(p, hw);
  std::vector<std::string> lines;
  for (size_t begin = 0, end; begin < text.size(); begin = end + 1) {
    end = text.find('\n', begin);
    lines.push_back(text.substr(begin, end - begin));
  }
  ASSERT_EQ(lines.size(), 3u) << text;
  EXPECT_EQ(lines[0].rfind("predicted step on round (datasheet profile", 0), 0u) << text;
  EXPECT_EQ(lines[1].rfind("    element-wise, routing  1000000000", 0), 0u) << text;
  EXPECT_GT(lines[1].size(), 300u) << text;  // the 301 digits of 1e303 ms, then the rest of the line
  EXPECT_NE(lines[1].find(" ms   99.0%       0.06 GB at  50% of the memory bandwidth"), std::string::npos) << text;
  EXPECT_NE(lines[2].find("TFLOP at  25% of the peak"), std::string::npos) << text;
}

}  // namespace
}  // namespace moe

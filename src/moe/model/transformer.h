// The OLMoE-family decoder: explicit forward and backward per layer, no autograd tape.
// Activations saved for backward and all scratch live in buffers reserved in the caller's
// arena at construction (sized from the config and the microbatch shape). Backward adds (+=)
// into the gradient buffers, so gradient accumulation over microbatches is free. With selective
// recompute (model/recompute.h) the activations a layer does not keep live in one shared set
// instead of one per layer, and backward computes them again before it reads them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "moe/core/arena.h"
#include "moe/model/config.h"
#include "moe/model/dispatch.h"
#include "moe/model/fp8_weights.h"
#include "moe/model/precision.h"
#include "moe/model/projections.h"
#include "moe/model/recompute.h"
#include "moe/model/weights.h"
#include "moe/ops/attention.h"
#include "moe/ops/elementwise.h"

namespace moe {

// How one microbatch's losses enter the gradient of the optimizer step's loss:
//   step loss = sum_tokens CE / global_tokens + aux_coef * mean_{microbatches, MoE layers} lb + z_coef * (same) z.
struct StepScales {
  float lm_grad_scale = 0;   // 1 / tokens in the whole global batch
  float aux_grad_scale = 0;  // 1 / (microbatches in the global batch x MoE layers)
  // The gradient buffers were just zeroed (first microbatch of a step): the expert weight
  // gradients may be written instead of added, which saves reading them back.
  bool gradients_zeroed = false;
};

// Per-microbatch statistics that add_stats accumulates on the model's device (one slot each).
enum MicrobatchStat : int {
  kStatLmSum,         // sum of token cross-entropies
  kStatLb,            // mean over MoE layers of the load-balancing loss
  kStatZ,             // mean over MoE layers of the router z-loss
  kStatReceivedRows,  // expert-buffer rows filled on this rank, over all MoE layers
  kNumMicrobatchStats
};

struct MicrobatchLosses {
  double lm_loss_sum = 0;  // sum of token cross-entropies
  double lb_loss = 0;      // mean over MoE layers of the load-balancing loss
  double z_loss = 0;       // mean over MoE layers of the router z-loss
  int64_t tokens = 0;
  int64_t routes = 0;          // (token, k) routes over all MoE layers
  int64_t dropped_routes = 0;  // of which dropped by capacity (sum over ranks to get the global count)
  int64_t received_rows = 0;   // expert-buffer rows filled on this rank, over all MoE layers
  int64_t capacity_rows = 0;   // expert-buffer rows available on this rank, over all MoE layers
};

// Routing state that is not trained by gradients.
struct RoutingState {
  Tensor router_bias;  // [L, N] selection-only bias (auxiliary-loss-free balancing); empty = none
  Tensor expert_load;  // [L, N] routes per expert, summed over forwards since the caller reset it; empty = not kept
};

// Called around each parameter block's use, for designs that keep parameters elsewhere between
// uses (FSDP: gather a block's full weights before its forward and its backward, reduce its
// gradients after). Blocks: 0 = embedding, 1..L = layers, L+1 = final norm and LM head.
class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  virtual void before_forward(int block) = 0;
  virtual void before_backward(int block) = 0;
  virtual void after_backward(int block) = 0;
  virtual void after_forward_only(int block) = 0;  // forward without backward (eval): release the block
};

// The part of the model one pipeline rank runs (parallel/pipeline_schedule.h): its chunks, each a
// contiguous run of layers [first, end) (the chunk with layer 0 also runs the embedding, the one
// ending at layer L the final norm and LM head), and the activation sets, one per microbatch in
// flight at once. The default is the whole model as one chunk with one set.
struct ModelChunks {
  std::vector<std::pair<int64_t, int64_t>> layers;  // per chunk [first, end); empty = {{0, L}}
  int activation_sets = 1;
};

class Transformer {
 public:
  Transformer(const ModelConfig& cfg, int64_t batch, int64_t seq_len, Arena& arena, TokenDispatcher& dispatcher,
              int lease_slots = 1, Recompute recompute = Recompute::None, Precision precision = Precision::BF16,
              Payload payload = Payload::BF16, const ModelChunks& chunks = {});

  // Forward and backward of one microbatch: tokens, targets [B*T] i32 on the model's device.
  // Gradients are added into g. Only queues work: nothing is read back to the host.
  void forward_backward(const ModelWeights& w, const ModelWeights& g, Tensor tokens, Tensor targets,
                        const StepScales& scales, uint64_t routing_seed, const RoutingState& rs);
  // Forward only, for evaluation.
  void forward_loss(const ModelWeights& w, Tensor tokens, Tensor targets, uint64_t routing_seed,
                    const RoutingState& rs);
  // stats[kStat...] += this microbatch's statistics (F32, on the model's device; queued, no host read).
  void add_stats(Tensor stats) const;
  // The last microbatch's statistics, read back to the host (waits for the device: tests, eval).
  MicrobatchLosses losses() const;
  // Forward to logits [B*T, V] (tests, interop checks).
  void forward_logits(const ModelWeights& w, Tensor tokens, Tensor logits, uint64_t routing_seed,
                      const RoutingState& rs);

  // Pipeline passes of one microbatch through chunk `chunk` (an index into ModelChunks::layers) in
  // activation set `set`. The first chunk reads tokens; another reads chunk_input(chunk, set), which
  // the caller fills with the previous chunk's output. chunk_forward leaves chunk_output(chunk, set)
  // for the next chunk. chunk_backward of the last chunk runs the final norm, the LM head and the
  // loss (fused with their backward) from the kept residual stream; of another chunk it reads
  // d(chunk output) from output_grad(), which the caller fills first. It leaves d(chunk input) in
  // input_grad(chunk, set) (the first chunk: the embedding gradient instead). Recomputed buffers
  // are shared by all sets (backward computes them again before reading them).
  void chunk_forward(int chunk, int set, const ModelWeights& w, Tensor tokens, uint64_t routing_seed,
                     const RoutingState& rs);
  void chunk_backward(int chunk, int set, const ModelWeights& w, const ModelWeights& g, Tensor tokens, Tensor targets,
                      const StepScales& scales);
  // Forward only (evaluation): releases the chunk's leases; the last chunk computes the loss sum,
  // and with `logits` given ([B*T, V] F32) the logits too.
  void chunk_forward_loss(int chunk, int set, const ModelWeights& w, Tensor tokens, Tensor targets,
                          uint64_t routing_seed, const RoutingState& rs, Tensor logits = {});
  Tensor chunk_input(int chunk, int set);
  Tensor chunk_output(int chunk, int set);
  Tensor output_grad();
  Tensor input_grad(int chunk, int set);
  // stats[kStat...] += the statistics of chunk `chunk` in set `set` (its layers' losses and rows;
  // the LM loss sum when it is the last chunk, valid right after its chunk_backward or chunk_forward_loss).
  void add_chunk_stats(Tensor stats, int chunk, int set) const;
  int chunks() const { return static_cast<int>(chunks_.size()); }
  bool has_head(int chunk) const { return chunks_.at(chunk).second == cfg_.num_hidden_layers; }
  bool has_embedding(int chunk) const { return chunks_.at(chunk).first == 0; }

  // Precision fp8: the FP8 caches of the weights the model is given (not owned; refreshed by the
  // parameter store after each update). Required before the first forward, refused for bf16.
  void set_fp8_weights(const Fp8WeightCache* cache);
  // Optional; not owned. Without hooks, weights and gradients are resident.
  void set_block_hooks(BlockHooks* hooks) { hooks_ = hooks; }
  // train.deterministic: the attention backward in a fixed summation order (AttentionShape), the
  // one GPU op whose default is not; set before the first backward.
  void set_deterministic(bool on) { attn_shape_.deterministic = on; }
  bool deterministic() const { return attn_shape_.deterministic; }
  // Device memory the model's library calls hold outside the arenas beyond kLibraryReserveBytes:
  // the deterministic attention backward's workspace on the GPU, else 0.
  int64_t library_workspace_bytes() const;
  int64_t rows() const { return rows_; }
  int64_t expert_rows() const { return capacity_; }
  Recompute recompute() const { return recompute_; }
  // Layers whose backward computed dropped activations again, since construction (model/recompute.h:
  // a layer whose backward follows its own forward skips it).
  int64_t recomputed_layers() const { return recomputed_layers_; }
  Precision precision() const { return precision_; }
  Payload payload() const { return payload_; }

 private:
  struct LayerActs {
    Tensor h_mid;  // residual stream after attention
    // attention
    Tensor a, rstd1, q_raw, k_raw, q, k, v, q_rstd, k_rstd, att, lse;
    // feed-forward input
    Tensor m, rstd2;
    // MoE
    Tensor logits, scores, topk_idx, topk_w, counts, route_index, offsets, gu, act, lb, z;
    // FP8 unless recompute = experts: the SwiGLU output as the down weight gradient's columns operand,
    // kept in place of act (which is then not reserved; fp8_act_columns()).
    Fp8Tensor act_columns;
    ExpertBuffers experts;  // expert_in (xe; FP8 codes and scales: fp8_expert_input()) and expert_out (ye):
                            // the lease's, or the dispatcher's recompute pair
    Lease lease;            // held from forward to backward unless the block is recomputed
    bool leased = false;
    Tensor shared_gu, shared_act;
    // dense MLP
    Tensor mlp_gu, mlp_act;
    // FP8: the shared expert's and the dense MLP's SwiGLU outputs as their down weight gradient's
    // columns operand, kept in place of shared_act and mlp_act (which are then not reserved).
    Fp8Tensor shared_act_columns, mlp_act_columns;
  };
  struct Scratch {
    Tensor dres, dm, datt, dq, dk, dv, dq_raw, dk_raw, da;
    Tensor dlogits, dlogits_act, dw, dact, dgu;  // dlogits_act: d(router logits) in the activation dtype
    Tensor dffn_act, dffn_gu;  // dense MLP and shared expert
    Tensor attn_ws, head_ws, router_ws;  // router_ws: router_losses' workspace (empty on the CPU)
    Tensor hn, rstd_f, loss_sum;
    Tensor recompute_topk_idx, recompute_topk_w;  // recompute = block: the re-run router's choice (not used)
    Tensor route_of_row;  // gathered_expert_grads_: the route each expert-buffer row holds (invert_route_index)
  };

  void reserve(Tensor& t, const std::string& name, DType dtype, Shape shape);
  void bind();
  void select(int chunk, int set);  // checks the indices; layer() and h() then address this set
  LayerActs& layer(int64_t l) { return layers_[set_][l]; }
  Tensor& h(int64_t l) { return h_[set_][l]; }
  void forward(const ModelWeights& w, Tensor tokens, uint64_t routing_seed, const RoutingState& rs, bool backward_follows);
  void forward_layers(int chunk, const ModelWeights& w, Tensor tokens, uint64_t routing_seed, const RoutingState& rs,
                      bool backward_follows);
  void head_loss_backward(const ModelWeights& w, const ModelWeights& g, Tensor targets, const StepScales& scales);
  void add_layer_stats(std::vector<ScalarTerm>& terms, int set, int64_t first, int64_t end) const;
  // Layer functions take the layer's weights w and their FP8 caches f (empty in bf16).
  void attention_internals(const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A, Tensor h_in);
  void attention_forward_layer(const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A, Tensor h_in);
  void dispatch_rows(LayerActs& A, const RoutePlan& plan);
  void experts_gate_up(const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A);
  void expert_internals(const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A);
  void shared_expert_internals(const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A, Tensor h_out = {});
  // The SwiGLU of the shared expert or a dense MLP (act, or in FP8 act_columns, what its backward
  // keeps) and with h_out its down product added into h_out; ffn_down_backward is its down backward
  // from s_.dres.
  void ffn_swiglu(Tensor h_out, Tensor act, const Fp8Tensor& act_columns, Tensor gu, Tensor w_down,
                  const Fp8Weight& f_down);
  void ffn_down_backward(Tensor dact, Tensor dw, Tensor act, const Fp8Tensor& act_columns, Tensor w_down,
                         const Fp8Weight& f_down);
  // The routed SwiGLU output is kept as FP8 columns (LayerActs::act_columns): in FP8 unless recompute
  // = experts recomputes it in the backward, where the BF16 values come out of the SwiGLU backward's
  // pass and are quantized there.
  bool fp8_act_columns() const { return precision_ == Precision::FP8 && recompute_ != Recompute::Experts; }
  // The expert input is held as FP8 rows (dispatch_fp8): with payload fp8, and in FP8 when every
  // route stays on this rank (gathered_expert_grads_).
  bool fp8_expert_input() const { return payload_ == Payload::FP8 || gathered_expert_grads_; }
  Fp8Tensor ffn_norm(int64_t l, const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A);
  void mlp_internals(const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A, const Fp8Tensor& m_rows,
                     Tensor h_out = {});
  void moe_forward_layer(int64_t l, const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A, Tensor h_out,
                         uint64_t routing_seed, const RoutingState& rs);
  void mlp_forward_layer(const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A, Tensor h_out,
                         const Fp8Tensor& m_rows);
  void recompute_layer(int64_t l, const LayerWeights& w, const Fp8LayerWeights& f, LayerActs& A);
  void backward_layers(int chunk, const ModelWeights& w, const ModelWeights& g, Tensor tokens, const StepScales& scales);
  // recompute: compute the layer's dropped activations again first (false where the shared
  // buffers still hold this layer's forward: recompute.h).
  void attention_backward_layer(const LayerWeights& w, const Fp8LayerWeights& f, const LayerWeights& g, LayerActs& A,
                                Tensor h_in, bool recompute);
  void moe_backward_layer(const LayerWeights& w, const Fp8LayerWeights& f, const LayerWeights& g, LayerActs& A,
                          const StepScales& scales, bool recompute);
  // Whether layer l writes dropped activations into the shared buffers (experts and attention modes).
  bool drops_activations(int64_t l) const;
  void mlp_backward_layer(const LayerWeights& w, const Fp8LayerWeights& f, const LayerWeights& g, LayerActs& A);
  const Fp8LayerWeights& fp8_layer(int64_t l) const;
  int64_t moe_layers() const;
  void release_leases();

  ModelConfig cfg_;
  int64_t batch_, seq_len_, rows_, capacity_;
  Device dev_;
  DType act_;  // activations: F32 on the CPU, BF16 on the GPU
  Recompute recompute_;
  Precision precision_;
  Payload payload_;  // ep.payload: what dispatch moves to other ranks' experts (model/dispatch.h)
  // FP8, payload bf16, every route on this rank (TokenDispatcher::routes_stay_local): the expert
  // backward's FP8 operands of the expert input (columns) and of the expert output gradient (rows and
  // columns) are quantized from the token rows (moe/ops/fp8_gather.h), so neither the BF16 expert
  // input nor d(expert output) is stored; the dispatch stores the FP8 rows the gate/up product reads.
  // The same bits as the BF16 payload through the dispatcher.
  bool gathered_expert_grads_ = false;
  AttentionShape attn_shape_;
  Arena& arena_;
  TokenDispatcher& dispatcher_;
  std::vector<std::pair<int64_t, int64_t>> chunks_;  // [first, end) layers per chunk
  // Per activation set: h_[set][l] the input of layer l (h_[set][L] the final residual stream),
  // layers_[set][l] what layer l keeps, dh_in_[set][c] d(input) of chunk c (chunks after the first).
  // Only the layers of this rank's chunks are reserved.
  std::vector<std::vector<Tensor>> h_;
  std::vector<std::vector<LayerActs>> layers_;
  std::vector<std::vector<Tensor>> dh_in_;
  int set_ = 0;
  // The layer and activation set whose forward last wrote the shared recompute buffers and whose
  // backward has not run since ({-1, -1}: none, or they have been written again).
  struct ScratchOwner {
    int set = -1;
    int64_t layer = -1;
  } scratch_holds_;
  int64_t recomputed_layers_ = 0;
  Scratch s_;
  Arena::Slot stats_slot_;  // losses(): one microbatch's statistics
  std::vector<std::pair<Tensor*, Arena::Slot>> pending_;
  bool bound_ = false;
  BlockHooks* hooks_ = nullptr;
  std::unique_ptr<Projections> proj_;   // the linear layers in precision_
  const Fp8WeightCache* fp8_ = nullptr;  // precision fp8 only
};

}  // namespace moe

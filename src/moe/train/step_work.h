// The work of one training step on one rank, by kind: the FLOPs of the matrix products, the HBM
// bytes of the memory-bound passes and the bytes that cross between ranks. One source for the
// measured step split (step_split.h: achieved rate = work / measured time) and the performance
// model (perf/step_model.h: predicted time = work / (peak x efficiency)); the FLOPs come from
// count_flops (flops.h), the MFU's count.
//
// Byte counts are the main reads and writes of each pass as the GPU kernels make them (BF16
// activations, F32 router scores, logits and gradients), not every scale or index word:
//   per layer and token, forward: input RMSNorm 2d, QK-norm 2(q+kv), RoPE 2(q+kv), residual copy 2d,
//   FFN RMSNorm 2d; MoE: gather K d in and K d out, SwiGLU 3 K h, combine K d + d, residual copy
//   2d, router scores 8 N bytes; shared expert SwiGLU 3 s; dense MLP SwiGLU 3 h_d + copy 2d.
//   Backward: RoPE 2(q+kv), QK-norm 3(q+kv), the two RMSNorms 4d each; combine backward d + 2 K d,
//   SwiGLU backward 5 K h (5 s, 5 h_d), gather backward K d + d, router backward 12 N bytes.
//   Head: final RMSNorm 2d + 4d, the LM head's F32 logits written, read and their gradient
//   written (12 V bytes), the embedding row read and written 2d and its F32 gradient row 10 d bytes.
// Recompute adds the forward passes (FLOPs and bytes) it repeats (experts and attention: not the
// top layer's without pipeline, model/recompute.h).
// FP8 (train.precision = fp8): the SwiGLU forwards quantize their output in the same kernel, which
// the split times as FP8 quantize, so their bytes move there (fp8_quantize_bytes, listed per kernel
// in step_work.cpp), and so do the SwiGLU backwards' that quantize d(gate/up); the RMSNorms that
// quantize write d codes more; the FP8 dispatch scatter (ep.payload = fp8, and at EP 1, where the
// expert backward's FP8 operands are gathered from the token rows) writes K d codes in place of BF16
// rows; at EP 1 the combine backward writes no d(expert output) (K d fewer). Rows of expert buffers
// are counted per route (T K), not per slot: with a capacity factor above 1 the kernels that run
// over every slot (the experts' input rows, the BF16 SwiGLU) move that much more (the FP8 SwiGLU
// kernels that write both layouts load only the rows inside the expert segments).
#pragma once

#include <cstdint>
#include <string>

#include "moe/train/config.h"
#include "moe/train/flops.h"

namespace moe {

// How the ranks of a run are laid out, as far as one rank's work depends on it.
struct RankLayout {
  int64_t world = 1;          // ranks (GPUs)
  int64_t pp = 1;             // pipeline stages
  int64_t virtual_stages = 1; // model chunks per stage (the interleaved schedule)
  // A stage's share of the model's forward FLOPs (its passes) and of its parameters (its optimizer,
  // gradient reduction and caches): by default the heaviest stage's of each, whose pace the
  // pipeline runs at (they may be two different stages: an upper bound); 0: an equal split,
  // num_hidden_layers / pp layers per stage.
  double stage_share = 0;
  double stage_param_share = 0;
  std::string mode = "ddp";   // ddp (resident weights, EP) or fsdp
  int64_t ep = 1;             // ranks per EP group (ddp)
  int64_t dp() const { return world / pp; }
};

// The layout a run of `cfg` on `world` ranks has: mode, ep and the pipeline from the config, the
// stage shares from the trainer's own stage boundaries (train/pipeline_layout.h: given or balanced
// by per-layer cost, the embedding and LM head counted): the heaviest stage's, or stage `stage`'s
// when given (a rank that splits its own measured step).
RankLayout rank_layout(const Config& cfg, int64_t world, int stage = -1);

struct StepWork {
  double tokens = 0;                 // tokens this rank trains per step
  double microbatches = 0;           // microbatches per optimizer step on this rank
  double tokens_per_microbatch = 0;  // per rank
  // Matrix products, FLOPs per step (forward and backward, recompute included).
  double expert_flops = 0;           // routed experts (grouped GEMMs)
  double dense_flops = 0;            // attention projections, router, shared expert, dense MLPs, LM head
  double attention_flops = 0;        // scores, the MFU's full-square convention
  double recompute_flops = 0;        // of the three above, what recompute repeats (not in the MFU)
  double fp8_dense_flops = 0;        // of dense_flops, the products that run in FP8 (train.precision = fp8)
  bool fp8_experts = false;          // the expert products run in FP8
  double rows_per_expert = 0;        // rows of one expert's products per microbatch: the grouped GEMM's shape class
  // Memory-bound passes, HBM bytes per step.
  double elementwise_bytes = 0;      // norms, RoPE, SwiGLU, routing, gather/combine, loss, embedding, copies
  double expert_grad_accumulate_bytes = 0;  // F32 expert gradients read back by the weight-gradient products that
                                            // accumulate (DDP: microbatches after the first; FSDP: every one)
  double fp8_quantize_bytes = 0;     // the FP8 quantize kernels (activation operands and output gradients, by rows
                                     // and by columns, the quantizing SwiGLU forward): all they read and write;
                                     // quantization fused into RMSNorm and the dispatch is element-wise
  double fp8_cache_bytes = 0;        // the weights' FP8 caches' own pass, once per step with several ranks (F32 read, two FP8 orientations written); one rank: inside AdamW
  double fp8_cache_in_adamw_bytes = 0;  // one rank per stage in FP8: the caches AdamW writes (in adamw_bytes)
  double adamw_bytes = 0;            // the AdamW kernels: 28 bytes per shard parameter (F32 moments), 30 with the BF16 copy
                                     // written in the same pass; 8 fewer with BF16 moments
  double grad_norm_bytes = 0;        // 4 per shard parameter
  double optimizer_other_bytes = 0;  // BF16 refresh of gathered weights (6 per parameter), gradient zeroing (4)
  double params_updated = 0;         // this rank's AdamW shard
  // Communication, bytes per rank per step.
  double dispatch_bytes = 0;         // routed rows to other ranks of the EP group and back: dispatch and combine in
                                     // forward and backward, routes x d x 2 x (ep-1)/ep each
  double dense_grad_params = 0;      // dense parameters reduced over dense_group (ZeRO-1: F32 reduce-scatter of the
  int64_t dense_group = 1;           // gradients and F32 all-gather of the updated shards)
  double expert_grad_params = 0;     // this rank's expert parameters, reduced over expert_group (its expert replicas)
  int64_t expert_group = 1;
  double fsdp_gather_bytes = 0;      // FSDP: full BF16 blocks all-gathered per step (before forward and backward;
  double fsdp_reduce_bytes = 0;      // one rank copies them); full F32 block gradients reduce-scattered per step
  int64_t fsdp_group = 1;
  int64_t pipeline_stages = 1;       // layout.pp
  int64_t pipeline_virtual_stages = 1;  // layout.virtual_stages
  double total_flops() const { return expert_flops + dense_flops + attention_flops; }
};

// One rank's work per optimizer step of `cfg` under `layout` (BF16 activations, as on the GPU).
// Throws when the layout cannot run the config's batch (global batch not a multiple of
// micro batch x data-parallel ranks, layers not a multiple of pp).
StepWork step_work(const Config& cfg, const RankLayout& layout);

}  // namespace moe

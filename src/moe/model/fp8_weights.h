// The FP8 weight caches of train.precision = "fp8" (model/precision.h): for every quantized matrix
// W [out, in] (or the experts' [E, out, in]) its E4M3 codes in 128x128 blocks in both orientations
// the products read: W itself for the forward (x W^T) and W^T for the data gradient (dy W, which
// contracts over `out`). The FP32 weights stay the truth: the caches are derived from them once
// per optimizer step, never per microbatch: with one rank per pipeline stage the AdamW pass writes
// them (targets(), adamw_step_quantize_blocks); refresh() derives them at init and load, and after
// each update when a stage has several data-parallel ranks (after the ZeRO-1 gather).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moe/core/arena.h"
#include "moe/core/stream.h"
#include "moe/model/config.h"
#include "moe/model/params.h"
#include "moe/model/weights.h"
#include "moe/ops/fp8.h"

namespace moe {

// One matrix's two cached orientations. Empty (no codes) for a matrix the layer does not have.
struct Fp8Weight {
  Fp8Tensor w;    // codes like W: forward
  Fp8Tensor w_t;  // codes like W^T: data gradient
  bool empty() const { return w.codes.empty(); }
};

struct Fp8LayerWeights {
  Fp8Weight q_proj, k_proj, v_proj, o_proj;
  Fp8Weight experts_gate_up, experts_down;  // this rank's experts
  Fp8Weight shared_gate_up, shared_down;
  Fp8Weight mlp_gate_up, mlp_down;
};

// The layers whose weights a rank holds (a pipeline stage's; all without pipeline), from its
// registry: what its FP8 caches cover.
std::vector<bool> held_layers(const ModelConfig& cfg, const ParamRegistry& reg);

// Elements of the matrices an FP8 run quantizes, for a rank with `local_experts` experts per MoE
// layer holding the layers flagged in `held` (empty: all): what needs no BF16 compute copy.
int64_t fp8_quantized_numel(const ModelConfig& cfg, int64_t local_experts, const std::vector<bool>& held = {});
// The quantized matrices among w's tensors (the fused gate/up views count once), every layer.
std::vector<Tensor> fp8_quantized_matrices(const ModelWeights& w);

class Fp8WeightCache {
 public:
  // Reserves the caches in `arena` (under compute_weights.fp8.*: the memory plan counts them with
  // the BF16 compute copy) for the matrices of `cfg` with `local_experts` experts per MoE layer, in
  // the layers flagged in `held` (empty: all; a pipeline stage caches only its own layers).
  Fp8WeightCache(const ModelConfig& cfg, int64_t local_experts, Arena& arena, const std::vector<bool>& held = {});

  // Quantizes every cached matrix from `master` (FP32 views, e.g. bind_weights over the FP32
  // parameters). Queued on `stream`; nothing read back.
  void refresh(const ModelWeights& master, Stream stream = {});
  // Every cached matrix of `master` with its cache, in layer order: what refresh() quantizes, for
  // an optimizer that writes the caches as it updates the weights (adamw_step_quantize_blocks).
  // `master` holds exactly the cached layers' weights (the others' are empty).
  std::vector<std::pair<Tensor, Fp8Weight>> targets(const ModelWeights& master);

  // Layer l's caches (all empty for a layer the rank does not hold).
  const Fp8LayerWeights& layer(int64_t l) const;

 private:
  void bind();

  struct Pending {
    Fp8Tensor* target;
    Arena::Slot codes, scales;
  };
  ModelConfig cfg_;
  Arena& arena_;
  std::vector<Fp8LayerWeights> layers_;
  std::vector<Pending> pending_;
  bool bound_ = false;
};

}  // namespace moe

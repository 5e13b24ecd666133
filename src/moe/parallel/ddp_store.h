// The resident-weight design: every rank holds the full dense weights and
// its EP slice of the experts for the whole run; after the last microbatch of a window the
// gradients are reduced over each parameter's replica group and a ZeRO-1 sharded AdamW
// updates the shards and all-gathers them back into the resident weights.
//
// With overlap_grad_reduce the store is also the model's BlockHooks: during the last microbatch
// of a window, each gradient bucket's reduce-scatter starts after the backward of the last block
// (in backward order) that writes into it, on DistributedAdamW's queue, so the reduction runs
// while the backward of the earlier blocks does; enqueue_step waits for what is still running.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "moe/comm/mesh.h"
#include "moe/core/arena.h"
#include "moe/model/fp8_weights.h"
#include "moe/model/precision.h"
#include "moe/optim/distributed_adamw.h"
#include "moe/parallel/param_store.h"

namespace moe {

// How the gradients are reduced (parallel.overlap_grad_reduce, parallel.grad_bucket_bytes).
struct GradReduceOptions {
  bool overlap = false;  // start buckets during the last microbatch's backward
  size_t bucket_bytes = DistributedAdamW::kDefaultBucketBytes;
};

class DdpStore final : public ParamStore, public BlockHooks {
 public:
  // reg must use ParamLayout::ByReplicaGroup with this rank's expert slice. Reserves in `arena`,
  // the AdamW moments in moment_dtype (F32 or BF16: optim.moment_dtype), and with precision fp8 the
  // FP8 weight caches, refreshed from the FP32 weights after each update, init and load.
  // reduce.overlap: reduce buckets during the last microbatch's backward (collective over the
  // mesh's groups at construction). use = Evaluation: the weights and their caches only.
  DdpStore(const ModelConfig& cfg, const ParamRegistry& reg, const Mesh& mesh, Arena& arena, DType moment_dtype,
           Precision precision = Precision::BF16, GradReduceOptions reduce = {}, StoreUse use = StoreUse::Training);

  const ModelWeights& weights() const override { return weights_; }
  const ModelWeights& grads() const override { return grads_; }
  // The hooks only start reductions: nullptr where nothing overlaps (one rank, overlap off).
  BlockHooks* hooks() override { return optimizer_ && optimizer_->overlaps_reduction() ? this : nullptr; }
  void begin_microbatch(bool last_of_window) override { reduce_in_backward_ = last_of_window && hooks() != nullptr; }
  double reduction_wait_s() const override { return optimizer_ ? optimizer_->reduction_wait_s() : 0; }
  const Fp8WeightCache* fp8_weights() const override { return fp8_.get(); }
  void init(uint64_t seed) override;
  void zero_grads(bool experts_written) override;
  void enqueue_step(const AdamWConfig& cfg, float max_norm, int64_t step, Tensor schedule = {}) override;
  StepResult last_step() const override;
  void reduced_gradients(const GradientFn& fn) override;
  std::vector<CheckpointSlice> checkpoint_slices() const override;
  void load(const CheckpointReader& ckpt) override;
  void load_weights(const TensorReadFn& read) override;

  // BlockHooks: after block b's backward in the last microbatch, the buckets it completes start.
  void before_forward(int) override {}
  void before_backward(int) override {}
  void after_backward(int block) override;
  void after_forward_only(int) override {}
  // Buckets started by after_backward (inside a backward, not after it), summed over the run.
  int64_t buckets_started_in_backward() const { return started_in_backward_; }

  // FP32 main weights (none in an evaluation's BF16 store on the GPU). The model reads weights(): on
  // the CPU the FP32 weights, on the GPU a BF16 copy refreshed after every update (in FP8, of the
  // tensors that are not quantized only).
  Tensor params() const { return arena_.get(params_); }
  Tensor grads_flat() const { return arena_.get(grads_slot_); }
  const DistributedAdamW& optimizer() const { return training_optimizer(); }
  // The buckets whose reductions start after block b's backward (with overlap; empty without).
  const std::vector<int>& buckets_started_after(int block) const;

 private:
  void bind();
  void plan_bucket_starts();
  void bind_compact_copy();        // FP8 on the GPU: the copy holds the unquantized tensors only
  void refresh_compute_weights();  // and the FP8 caches
  void refresh_fp8_weights();
  void init_compute_copy(uint64_t seed);  // compute_only_: init() into the BF16 copy
  // The optimizer, or an error naming `call` for an evaluation's store (it has none).
  DistributedAdamW& training_optimizer(const char* call = "optimizer") const;

  ModelConfig cfg_;
  const ParamRegistry& reg_;
  const Mesh& mesh_;
  Arena& arena_;
  Arena::Slot params_, grads_slot_, compute_;
  bool has_compute_copy_ = false;
  bool compact_compute_ = false;  // the copy holds the unquantized tensors only (FP8 on the GPU)
  bool compute_only_ = false;     // an evaluation in BF16 on the GPU: the BF16 copy, no FP32 weights
  std::vector<std::pair<Tensor, Tensor>> compute_copies_;  // compact: (FP32 source, BF16 copy) per tensor
  DistributedAdamW::UpdateOutputs update_outputs_;         // what a one-rank update writes (bind())
  std::unique_ptr<DistributedAdamW> optimizer_;  // null in an evaluation's store (StoreUse::Evaluation)
  std::unique_ptr<Fp8WeightCache> fp8_;  // precision fp8 only
  ModelWeights weights_, grads_, master_;  // master_: FP32 views, what the FP8 caches are quantized from
  bool bound_ = false;
  // The buckets block b's backward completes: every parameter they read belongs to block b or to
  // a block whose backward ran before (a higher one).
  std::vector<std::vector<int>> buckets_completed_by_block_;
  bool reduce_in_backward_ = false;  // the current microbatch is the last of its window
  int64_t started_in_backward_ = 0;
};

}  // namespace moe

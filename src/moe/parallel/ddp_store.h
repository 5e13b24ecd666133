// The resident-weight design: every rank holds the full dense weights and
// its EP slice of the experts for the whole run; after the last microbatch of a window the
// gradients are reduced over each parameter's replica group and a ZeRO-1 sharded AdamW
// updates the shards and all-gathers them back into the resident weights.
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

class DdpStore final : public ParamStore {
 public:
  // reg must use ParamLayout::ByReplicaGroup with this rank's expert slice. Reserves in `arena`,
  // the AdamW moments in moment_dtype (F32 or BF16: optim.moment_dtype), and with precision fp8 the
  // FP8 weight caches, refreshed from the FP32 weights after each update, init and load.
  DdpStore(const ModelConfig& cfg, const ParamRegistry& reg, const Mesh& mesh, Arena& arena, DType moment_dtype,
           Precision precision = Precision::BF16);

  const ModelWeights& weights() const override { return weights_; }
  const ModelWeights& grads() const override { return grads_; }
  BlockHooks* hooks() override { return nullptr; }
  const Fp8WeightCache* fp8_weights() const override { return fp8_.get(); }
  void init(uint64_t seed) override;
  void zero_grads(bool experts_written) override;
  void enqueue_step(const AdamWConfig& cfg, float max_norm, int64_t step, Tensor schedule = {}) override;
  StepResult last_step() const override;
  void reduced_gradients(const GradientFn& fn) override;
  std::vector<CheckpointSlice> checkpoint_slices() const override;
  void load(const CheckpointReader& ckpt) override;
  void load_weights(const TensorReadFn& read) override;

  // FP32 main weights. The model reads weights(): on the CPU the FP32 weights, on the GPU a BF16
  // copy refreshed after every update (in FP8, of the tensors that are not quantized only).
  Tensor params() const { return arena_.get(params_); }
  Tensor grads_flat() const { return arena_.get(grads_slot_); }

 private:
  void bind();
  void refresh_compute_weights();  // and the FP8 caches
  void refresh_fp8_weights();

  ModelConfig cfg_;
  const ParamRegistry& reg_;
  const Mesh& mesh_;
  Arena& arena_;
  Arena::Slot params_, grads_slot_, compute_;
  bool has_compute_copy_ = false;
  bool compact_compute_ = false;  // the copy holds the unquantized tensors only (FP8 on the GPU)
  std::vector<std::pair<Tensor, Tensor>> compute_copies_;  // compact: (FP32 source, BF16 copy) per tensor
  std::unique_ptr<DistributedAdamW> optimizer_;
  std::unique_ptr<Fp8WeightCache> fp8_;  // precision fp8 only
  ModelWeights weights_, grads_, master_;  // master_: FP32 views, what the FP8 caches are quantized from
  bool bound_ = false;
};

}  // namespace moe

// The FSDP baseline (parallel.mode = fsdp): the legacy design the resident-weight design is
// measured against. Every parameter block (embedding, each layer with all N experts, final
// norm + LM head) is sharded in equal contiguous pieces over all ranks; AdamW runs on the
// shards. Before a block's forward its full weights are all-gathered into one shared gather
// buffer (so they are "freed" when the next block is gathered), again before its backward,
// and its gradients are reduce-scattered into the gradient shards after its backward.
// No expert parallelism: every rank runs every expert on its own tokens.
//
// On the GPU (an arena on the CUDA device) the shards keep a BF16 copy, written by AdamW in its
// own pass, and the blocks are all-gathered from it in BF16 (the mixed-precision FSDP of
// PyTorch: half the bytes of an FP32 gather), into a BF16 gather buffer the model reads as its
// compute weights. Gradients stay FP32 (reduce-scattered in FP32), as do the shards; the moments
// are FP32 or BF16 (optim.moment_dtype).
#pragma once

#include <vector>

#include "moe/comm/communicator.h"
#include "moe/core/arena.h"
#include "moe/parallel/param_store.h"

namespace moe {

class FsdpStore final : public ParamStore, public BlockHooks {
 public:
  // reg must use ParamLayout::ByBlock with all experts on this rank. Reserves in `arena`, the AdamW
  // moments in moment_dtype (F32 or BF16). use = Evaluation: the weight shards and the gather
  // buffer only.
  FsdpStore(const ModelConfig& cfg, const ParamRegistry& reg, Communicator& world, Arena& arena, DType moment_dtype,
            StoreUse use = StoreUse::Training);

  const ModelWeights& weights() const override { return weights_; }
  const ModelWeights& grads() const override { return grads_; }
  BlockHooks* hooks() override { return this; }
  void init(uint64_t seed) override;
  void zero_grads(bool experts_written) override;
  void enqueue_step(const AdamWConfig& cfg, float max_norm, int64_t step, Tensor schedule = {}) override;
  StepResult last_step() const override;
  void reduced_gradients(const GradientFn& fn) override;
  std::vector<CheckpointSlice> checkpoint_slices() const override;
  void load(const CheckpointReader& ckpt) override;
  void load_weights(const TensorReadFn& read) override;

  void before_forward(int block) override;
  void before_backward(int block) override;
  void after_backward(int block) override;
  void after_forward_only(int) override {}

  int64_t bytes_gathered() const { return bytes_gathered_; }
  int64_t bytes_reduced() const { return bytes_reduced_; }

 private:
  struct Block {
    int64_t begin = 0, end = 0;  // element range in the full ByBlock layout
    int64_t shard = 0;           // elements per rank (padded)
    int64_t shard_offset = 0;    // where this block's shard starts in the shard buffers
    std::vector<int> params;     // registry indices
  };
  // Calls fn(param index, [lo, hi) element range inside the parameter, offset in the shard buffers)
  // for every piece of every parameter that lies in this rank's shards.
  template <typename Fn>
  void for_each_owned_piece(Fn&& fn) const;
  void bind();
  void gather(int block);
  Tensor compute_shards() const;  // what gather() sends: the BF16 shard copy on the GPU, else the F32 shards
  void check_training(const char* call) const;  // an error naming `call` in an evaluation's store

  ModelConfig cfg_;
  const ParamRegistry& reg_;
  Communicator& world_;
  Arena& arena_;
  std::vector<Block> blocks_;
  Arena::Slot w_shard_, g_shard_, m_, v_, gather_w_, grad_full_, rs_tmp_, norm_sq_, norm_ws_;
  Arena::Slot w_shard_bf16_;  // GPU only
  DType compute_ = DType::F32;  // the gathered weights' dtype: BF16 on the GPU
  ModelWeights weights_, grads_;
  bool training_ = true;  // false: an evaluation's store (StoreUse::Evaluation)
  bool bound_ = false;
  int64_t bytes_gathered_ = 0, bytes_reduced_ = 0;
};

}  // namespace moe

// Distributed AdamW (ZeRO-1 style): the AdamW moments are sharded over each
// replica group. Dense parameters are replicated over the world, expert parameters (this rank's
// EP slice) over mesh.expert_replicas; each group splits its region of the flat buffers into
// equal contiguous shards, one per rank (the region padded to a multiple of the group size).
//
// Step order (after the last microbatch of an accumulation window, every rank holding its local
// gradient sum):
//   1. reduce-scatter (sum) of the gradients over each group, in buckets, into this rank's shard;
//   2. global squared norm: this rank's dense + expert shard, all-reduced over the world;
//   3. AdamW on the shard, one call per parameter piece (own weight decay), with clipping and
//      the non-finite skip decided from the norm in memory (the same on every rank); with one rank
//      the same pass also writes the caller's update outputs (BF16 copies, FP8 weight caches);
//   4. all-gather of the updated shards back into the full params buffer, per group.
//
// The main weights of a shard are that slice of the trainer's FP32 params buffer: only moments (F32
// or BF16, optim.moment_dtype), the gradient shard, the norm scalar and staging are reserved here.
// With one rank the result equals AdamW bit for bit, and nothing is reduced or gathered: AdamW
// reads the gradient buffer in place (no shard copy, no staging).
//
// Overlapped reduction (overlap_reduction = true, several ranks): step 1 runs on a CommQueue
// (a worker thread on CPU ranks, a second stream on the GPU) over communicators of its own, split
// from the groups at construction. A caller that knows when gradients are final (DdpStore's
// block hooks, during the last microbatch's backward) starts each bucket then with
// start_reduction(); enqueue_step starts the rest and waits for all of them before the norm,
// which reads every bucket. Each bucket is the same collective on the same staged input as
// without overlap, so the results are the same bit for bit on CPU ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "moe/comm/comm_queue.h"
#include "moe/comm/mesh.h"
#include "moe/core/arena.h"
#include "moe/model/params.h"
#include "moe/ops/fp8.h"
#include "moe/ops/optim.h"

namespace moe {

class DistributedAdamW {
 public:
  static constexpr size_t kDefaultBucketBytes = size_t{16} << 20;

  // Reserves the shard moments (in moment_dtype: F32 or BF16), gradient shard, norm scalar and
  // staging in `arena` (which the caller commits). `reg` and `mesh` must outlive the optimizer.
  // overlap_reduction: collective over each group at construction (it splits the queue's
  // communicators off them), unless the mesh only plans memory.
  DistributedAdamW(const ParamRegistry& reg, const Mesh& mesh, Arena& arena, DType moment_dtype = DType::F32,
                   size_t bucket_bytes = kDefaultBucketBytes, bool overlap_reduction = false);

  // The global norm of the reduced gradient before clipping; skipped: non-finite, nothing was
  // updated, on every rank.
  using Result = AdamWOutcome;
  // One step (step counts from 1). params and grads are the registry's flat FP32 buffers;
  // grads holds this rank's local gradient sum and is only read. params is updated everywhere
  // (every replica ends with identical values). Collective over the world.
  Result step(Tensor params, Tensor grads, const AdamWConfig& cfg, float max_norm, int64_t step);
  // What the update also writes from the new FP32 weights, in its own pass, in a world of one rank:
  // BF16 copies of ranges of params (the model's compute copy), and the FP8 caches of the matrices
  // train.precision = "fp8" quantizes (adamw_step_quantize_blocks). Each `master` is a view into the
  // params buffer given to enqueue_step; no parameter may be split between a target and the rest,
  // and a parameter inside an FP8 target gets no BF16 copy (its model reads the caches).
  struct CopyTarget {
    Tensor master;  // F32, a range of params
    Tensor copy;    // BF16, master's element count
  };
  struct Fp8Target {
    Tensor master;  // F32 [N, K] or [E, N, K], a range of params
    Fp8Tensor w, w_t;
  };
  struct UpdateOutputs {
    std::vector<CopyTarget> bf16;
    std::vector<Fp8Target> fp8;
  };
  // The same without reading the result back (capturable in a CUDA graph); a non-empty schedule
  // (F32 [2]: lr, step, on the buffers' device) overrides cfg.lr and step (see adamw_step).
  // In a world of one rank the update writes `outputs` in the same pass and this returns true; with
  // several ranks the gathered params arrive after the update, so it writes none of them and
  // returns false: the caller refreshes them itself.
  bool enqueue_step(Tensor params, Tensor grads, const AdamWConfig& cfg, float max_norm, int64_t step,
                    Tensor schedule = {}, const UpdateOutputs& outputs = {});
  // The result of the last step (reads the norm from the device).
  Result last_result() const;

  // One collective of step 1: shard elements [k0, k0 + chunk) of every rank's shard of `group`.
  struct Bucket {
    ReplicaGroup group = ReplicaGroup::Dense;
    int64_t k0 = 0, chunk = 0;
  };
  // In the order step 1 issues them without overlap: dense, then expert, each by k0. Empty for a
  // world of one rank.
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // The flat ranges [begin, end) of the gradient buffer bucket i reads: one per rank of its group
  // (rank r's part of the bucket), without those past the region end.
  std::vector<std::pair<int64_t, int64_t>> bucket_inputs(int i) const;
  // True when step 1 runs on a queue beside the computation (overlap_reduction with several
  // ranks, on a communicator that allows it).
  bool overlaps_reduction() const { return queue_ && queue_->overlaps(); }
  // Starts reducing bucket i of `grads` (the flat gradient buffer, whose ranges bucket_inputs(i)
  // the caller will not change again before the step) on the queue; once per step, a second call
  // does nothing. Every rank of the bucket's group must start the same buckets in the same order.
  void start_reduction(int i, const Tensor& grads);
  // Waits for the reductions started so far and forgets them (the next step starts afresh); for
  // callers that change the gradients without a step in between.
  void finish_reductions();
  // Host seconds this rank spent in step 1 after the backward (the reductions not hidden behind
  // it: all of them without overlap, the wait for the outstanding ones with it), summed over steps.
  double reduction_wait_s() const { return reduction_wait_s_; }

  // This rank's shard of one replica group's region.
  struct Shard {
    int group_size = 1, group_rank = 0;
    int64_t region_begin = 0, region_end = 0;  // the region in the flat buffers
    int64_t shard_numel = 0;                   // padded: ceil(region / group_size)
    int64_t begin = 0, end = 0;                // flat elements this rank owns, clipped to the region
    int64_t buffer_offset = 0;                 // where the shard starts in exp_avg/exp_avg_sq/grad_shard
  };
  const Shard& shard(ReplicaGroup group) const { return group == ReplicaGroup::Dense ? dense_ : expert_; }

  // Shard buffers laid out [dense shard | expert shard] (each shard_numel long, padding zero), in
  // moment_dtype().
  DType moment_dtype() const { return moment_dtype_; }
  Tensor exp_avg() const { return arena_.get(m_); }
  Tensor exp_avg_sq() const { return arena_.get(v_); }
  // Empty for a world of one rank (the gradient buffer is the shard).
  Tensor grad_shard() const { return single_rank_ ? Tensor() : arena_.get(grad_shard_); }

  // The part of parameter `param` this rank's shard owns: logical (row-major, global) elements
  // [begin, end) of the tensor, and where its moments live. Across all ranks these slices
  // partition every logical tensor exactly once, so checkpoints store them as flat ranges under
  // the keys name + ".exp_avg" and name + ".exp_avg_sq".
  struct MomentSlice {
    int param = 0;
    const ParamEntry* entry = nullptr;
    int64_t begin = 0, end = 0;
    Tensor exp_avg, exp_avg_sq;  // 1-D views of end - begin elements of the shard buffers (moment_dtype())
  };
  // Valid once the arena is committed.
  std::vector<MomentSlice> moment_slices() const;

  // read_fn(key, logical_begin, logical_end, dst) fills dst (a view in moment_dtype() on the arena's
  // device) with elements [begin, end) of the logical tensor `key`; called for every moment slice
  // of this rank (keys as above).
  using ReadFn = std::function<void(const std::string& key, int64_t begin, int64_t end, const Tensor& dst)>;
  void load_moments(const ReadFn& read_fn) const;

 private:
  // A run of one parameter inside this rank's shard: flat elements [flat_begin, flat_begin + n)
  // of params, at buffer_offset in the shard buffers.
  struct Piece {
    int param = 0;
    int64_t flat_begin = 0, n = 0, buffer_offset = 0;
  };
  Shard plan_shard(ReplicaGroup group, Communicator* comm, int64_t buffer_offset);
  // What the update of one piece also writes (one rank): the FP8 target holding it (its call made at
  // the target's first piece), else its slice of a BF16 copy (empty: none).
  struct PieceOutput {
    const Fp8Target* fp8 = nullptr;
    bool first_of_fp8 = false;
    Tensor copy;
  };
  std::vector<PieceOutput> map_outputs(const Tensor& params, const UpdateOutputs& outputs) const;
  // Stages bucket b's input and reduce-scatters it into the gradient shard, on `stream`.
  void reduce_bucket(const Bucket& b, Communicator* comm, const Tensor& grads, Stream stream) const;
  void all_gather_params(const Shard& s, Communicator* comm, const Tensor& params);

  const ParamRegistry& reg_;
  const Mesh& mesh_;
  Arena& arena_;
  DType moment_dtype_ = DType::F32;
  int64_t bucket_elems_ = 0;  // elements per bucket over the whole group
  bool single_rank_ = false;  // a world of one: every group has one rank
  Shard dense_, expert_;
  std::vector<Bucket> buckets_;
  std::vector<Piece> pieces_;
  // Overlap: the queue, its communicators (split from world and expert_replicas) and which
  // buckets this step has started. Staging is shared: the queue runs one bucket at a time, and
  // the all-gather uses it only after the queue has been joined.
  std::unique_ptr<Communicator> queue_world_, queue_experts_;
  std::unique_ptr<CommQueue> queue_;  // after its communicators: destroyed (its worker joined) first
  std::vector<bool> started_;
  bool any_started_ = false;
  double reduction_wait_s_ = 0;
  Arena::Slot m_, v_, grad_shard_, norm_sq_, staging_, send_;
  Arena::Slot norm_ws_;  // sum_squares_accumulate's workspace
};

}  // namespace moe

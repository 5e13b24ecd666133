// ParamStore: how this rank holds the parameters, their gradients and the optimizer state, and
// runs the optimizer step. Two designs, measured against each other:
//   DdpStore  (ddp_store.h): resident full weights (the EP slice of the experts), gradients
//             reduced over each replica group, ZeRO-1 sharded AdamW;
//   FsdpStore (fsdp_store.h): the legacy baseline; every parameter sharded over all ranks, each
//             block's full weights gathered before its forward and again before its backward,
//             gradients reduce-scattered after its backward.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moe/ckpt/checkpoint.h"
#include "moe/model/fp8_weights.h"
#include "moe/model/transformer.h"
#include "moe/model/weights.h"
#include "moe/ops/optim.h"

namespace moe {

// What a store holds: a training run's weights, gradients and optimizer state, or, for an
// evaluation (`moetrain eval`), the weights alone: no gradient buffers and no optimizer state, so
// a model is evaluated where it could not be trained. An evaluation's store refuses the training
// calls (zero_grads, enqueue_step, last_step, reduced_gradients, checkpoint_slices); its load()
// reads the weights only.
enum class StoreUse { Training, Evaluation };

class ParamStore {
 public:
  virtual ~ParamStore() = default;
  // Views the model reads and accumulates into (for FSDP valid only inside the hooks' windows).
  virtual const ModelWeights& weights() const = 0;
  virtual const ModelWeights& grads() const = 0;
  // Hooks the model must call around each block (nullptr: weights are resident).
  virtual BlockHooks* hooks() = 0;
  // The FP8 caches of the weights (train.precision = "fp8"), refreshed by the store after every
  // change to the weights; nullptr without them.
  virtual const Fp8WeightCache* fp8_weights() const { return nullptr; }

  // Initializes the weights (a pure function of seed and logical index: the same model on any topology).
  virtual void init(uint64_t seed) = 0;
  // Zeroes the gradient buffers. experts_written: the caller's first microbatch writes every
  // routed-expert gradient instead of adding to it (the GPU's grouped weight gradient with
  // accumulate = false, experts without rows zeroed), so a store may leave those gradients as they
  // are (one pass less over most of the parameters).
  virtual void zero_grads(bool experts_written) = 0;

  // Called before each microbatch's forward + backward; last_of_window: the gradients are final
  // after this one's backward, so a store may start reducing them during it (through its hooks).
  virtual void begin_microbatch(bool /*last_of_window*/) {}
  // Host seconds spent reducing gradients after the backward (what the backward did not hide),
  // summed over the run; 0 for a store that reduces inside the backward.
  virtual double reduction_wait_s() const { return 0; }

  // The global gradient norm before clipping; skipped: non-finite, nothing changed, on every rank.
  using StepResult = AdamWOutcome;
  // Queues the reduction of the accumulated gradients over their replica groups and one AdamW
  // step, reading nothing back (a CUDA graph can capture it). A non-empty `schedule` (F32 [2]:
  // lr, step) supplies the learning rate and step from memory instead of cfg.lr and `step`.
  virtual void enqueue_step(const AdamWConfig& cfg, float max_norm, int64_t step, Tensor schedule = {}) = 0;
  // The last step's gradient norm and skip decision (waits for the device).
  virtual StepResult last_step() const = 0;
  // Both, for callers that want the result at once.
  StepResult step(const AdamWConfig& cfg, float max_norm, int64_t step) {
    enqueue_step(cfg, max_norm, step);
    return last_step();
  }

  // Reduces the accumulated gradients over their replica groups (as step() would) and hands this
  // rank's pieces of the reduced gradient to fn(name, logical begin, logical end, data). For tests
  // and diagnostics: it changes the gradient buffers; run step() only after zero_grads().
  using GradientFn = std::function<void(const std::string& name, int64_t begin, int64_t end, const float* data)>;
  virtual void reduced_gradients(const GradientFn& fn) = 0;

  // The slices of logical tensors this rank saves (weights under the HF name, moments under
  // <name>.exp_avg / <name>.exp_avg_sq), each element saved by exactly one rank.
  virtual std::vector<CheckpointSlice> checkpoint_slices() const = 0;
  // Reads what this rank holds (weights and moments) from a checkpoint written under any topology.
  virtual void load(const CheckpointReader& ckpt) = 0;
  // Reads elements [begin, end) of logical tensor `key` into dst (any device; F32 weights).
  using TensorReadFn = std::function<void(const std::string& key, int64_t begin, int64_t end, const Tensor& dst)>;
  // Reads the weights this rank holds (and refreshes the compute copies) and leaves the optimizer
  // state as it is: what `train --init-from` does after init(); load() reads the weights this way.
  virtual void load_weights(const TensorReadFn& read) = 0;
};

}  // namespace moe

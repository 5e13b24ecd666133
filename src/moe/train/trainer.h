// The training loop: plans all memory from the config, then runs optimizer steps of
// gradient-accumulated microbatches, with warmup + cosine LR, global-norm clipping, the
// non-finite skip, periodic evaluation, checkpoints and resume, and per-step metrics.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moe/core/arena.h"
#include "moe/data/dataset.h"
#include "moe/model/transformer.h"
#include "moe/model/weights.h"
#include "moe/optim/adamw.h"
#include "moe/parallel/local_dispatcher.h"
#include "moe/train/config.h"
#include "moe/train/flops.h"

namespace moe {

struct TrainOptions {
  std::string resume;      // checkpoint dir, run dir, or "latest" (= this run's dir); empty = fresh start
  bool bench = false;      // benchmark: write nothing to disk, print the throughput summary
  bool quiet = false;      // no progress lines (tests)
};

struct StepRecord {
  int64_t step = 0;  // optimizer steps completed
  double loss = 0, lm_loss = 0, lb_loss = 0, z_loss = 0;
  double grad_norm = 0, lr = 0;
  double step_time_s = 0, tokens_per_s = 0, mfu = 0;
  double dropped_fraction = 0, expert_load_max_over_mean = 0;
  bool skipped = false;
};

struct TrainSummary {
  int64_t first_step = 0, last_step = 0;  // steps run: (first_step, last_step]
  std::vector<StepRecord> steps;          // every step run, in order
  std::optional<double> eval_loss;        // at the end, when the held-out split is used
  std::optional<double> attainable_loss;  // synthetic corpus only
  int64_t skipped_steps = 0;
  double mean_tokens_per_s = 0, mean_mfu = 0, mean_step_time_s = 0;  // over steps after the first
  size_t arena_bytes = 0, peak_rss_bytes = 0;
};

class Trainer {
 public:
  Trainer(const Config& cfg, const TrainOptions& opts);
  TrainSummary run();

  // Mean LM loss over `batches` microbatches of the held-out split (all of it when fewer exist).
  double evaluate(int64_t batches);

  const ParamRegistry& registry() const { return reg_; }
  Tensor params() const { return state_.get(params_); }
  Tensor grads() const { return state_.get(grads_); }

 private:
  void load_checkpoint(const std::string& path);
  void save_checkpoint_now(int64_t step);
  StepRecord train_step(int64_t step);
  void update_router_bias();
  void print_plan() const;

  Config cfg_;
  TrainOptions opts_;
  ParamRegistry reg_;
  FlopCount flops_;
  TokenDataset data_;
  Arena state_{"model state"};
  Arena acts_{"activations"};
  Arena::Slot params_, grads_, tokens_, targets_, router_bias_, expert_load_;
  LocalDispatcher dispatcher_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<AdamW> optimizer_;
  ModelWeights w_, g_;
  int64_t start_step_ = 0;
  int64_t skipped_steps_ = 0;
};

}  // namespace moe

// The training loop: plans all memory from the config, then runs optimizer steps of
// gradient-accumulated microbatches on one or many ranks (DDP + expert parallelism, or the
// FSDP baseline), with the LR schedule (optim/lr_schedule.h), global-norm clipping, the non-finite skip, periodic
// evaluation, checkpoints and resume under any topology, and per-step metrics. The mechanisms
// it drives live elsewhere: device choice (device_choice.h), FLOP and MFU accounting
// (flops.h), the run directory (run_dir.h), metrics records (metrics.h), the checkpoint
// protocol (ckpt/distributed_checkpoint.h), the dispatcher choice (parallel/dispatcher_factory.h),
// router-bias balancing (model/router_bias.h) and eval windows (data/eval_windows.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "moe/ckpt/background_rank_file.h"
#include "moe/ckpt/checkpoint.h"
#include "moe/comm/communicator.h"
#include "moe/comm/mesh.h"
#include "moe/comm/timed_communicator.h"
#include "moe/core/arena.h"
#include "moe/core/power_summary.h"
#include "moe/core/kernel_profiler.h"
#include "moe/core/pass_timer.h"
#include "moe/core/side_stream.h"
#include "moe/core/step_graph.h"
#include "moe/data/dataset.h"
#include "moe/data/eval_windows.h"
#include "moe/data/instance_sampler.h"
#include "moe/model/dispatch.h"
#include "moe/model/transformer.h"
#include "moe/parallel/param_store.h"
#include "moe/train/config.h"
#include "moe/train/device_choice.h"
#include "moe/train/flops.h"
#include "moe/train/memory_plan.h"
#include "moe/train/metrics.h"
#include "moe/train/pipeline_executor.h"
#include "moe/train/run_model.h"

namespace moe {

class PowerMonitor;  // core/gpu_power.h

struct TrainOptions {
  std::string resume;  // checkpoint dir, run dir, or "latest" (= this run's dir); empty = fresh start
  // A fresh start from another run's checkpoint (or run dir) or a Hugging Face folder: its weights
  // only, step 0, fresh optimizer state (init_source.h). Excludes `resume`.
  std::string init_from;
  bool overwrite = false;  // a fresh run may set aside the run that run.dir holds (run_dir.h)
  std::string config_file;  // the --config file ("" or "tiny": the built-in): an input --overwrite leaves in place
  bool stop_on_signals = false;  // from the first step on, stop signals save a checkpoint and end run()
  // An opened checkpoint to start from instead of `resume` (its files stay readable while open,
  // even if a running job prunes them: `moetrain eval` opens it once).
  std::shared_ptr<const CheckpointReader> checkpoint;
  // `moetrain eval`: the run holds the weights only, no gradients or optimizer state (StoreUse), and
  // plans its memory so; run() and the step methods are refused.
  bool evaluation_only = false;
  bool bench = false;  // benchmark: write nothing to disk, print the throughput summary
  bool quiet = false;  // no progress lines (tests)
  // GPU runs: records kernel times from the second step run to the last (bench; not owned).
  KernelProfiler* profiler = nullptr;
  // GPU runs: the GPU's energy, clock and its slowdown reasons over the same steps (bench; not owned).
  PowerMonitor* power = nullptr;
};

struct TrainSummary {
  int64_t first_step = 0, last_step = 0;  // steps run: (first_step, last_step]
  int64_t planned_steps = 0;              // train.steps
  std::string stop_reason;                // why the run stopped before train.steps (a checkpoint was saved)
  std::vector<StepRecord> steps;          // every step run, in order (identical on every rank)
  std::optional<double> eval_loss;        // at the end, when the held-out split is used (may be NaN)
  std::vector<std::pair<std::string, double>> eval_sets;  // at the end: (name, loss) of each [[eval.sets]]
  std::optional<double> attainable_loss;  // synthetic corpus only
  int64_t skipped_steps = 0;
  double mean_tokens_per_s = 0, mean_mfu = 0, mean_step_time_s = 0;  // over the timed steps
  int64_t timed_steps = 0;        // the steps after the first, or the first when it is the only one run
  bool first_step_timed = false;  // only one step ran: the means include its start-up work (plans, workspaces)
  double mean_comm_time_s = 0, mean_optimizer_time_s = 0;
  double mean_reduction_wait_time_s = 0;  // CPU: gradient reduction after the backward (not hidden by it)
  size_t arena_bytes = 0, peak_rss_bytes = 0;
  Device device = Device::CPU;
  size_t device_peak_bytes = 0;  // GPU: most device memory in use after a step (the process's high-water)
  size_t graph_nodes = 0;        // train.cuda_graph: nodes of the captured step
  std::optional<PowerSummary> power;  // with TrainOptions::power: the steps after the first
  nlohmann::json init_from;           // where the run's first weights came from (InitSource::record; null: its own)
};

struct EvalReport {
  double mean_loss = 0;    // mean token cross-entropy over the evaluated windows
  int64_t tokens = 0;      // predicted tokens evaluated (all ranks)
  double tokens_per_s = 0;
  int64_t windows_skipped = 0;  // trailing windows that did not fill a microbatch on every rank
};

class Trainer {
 public:
  // world: all ranks of the job (a LocalCommunicator for one process).
  Trainer(const Config& cfg, const TrainOptions& opts, Communicator& world);
  ~Trainer();
  TrainSummary run();

  // Forward and backward of every microbatch of optimizer step `step` (0-based) into the
  // gradient buffers (zeroed first); no optimizer step.
  void accumulate_gradients(int64_t step);

  // One optimizer step (0-based `step`): accumulate_gradients, reduction, AdamW, statistics.
  StepRecord train_step(int64_t step);

  // `moetrain eval`: the mean LM loss over a token file or a folder of .npy files, read as
  // consecutive windows of seq_len + 1 tokens with stride seq_len (each token after a window's
  // first is predicted once), up to max_tokens predicted tokens (0 = all). Windows are dealt to
  // ranks round robin. When logits_npy is set, rank 0 writes the logits of its first
  // microbatch there ([B*T, V] float32) for comparisons with other implementations.
  EvalReport evaluate_data(const std::string& path, int64_t max_tokens, const std::string& logits_npy = "");

  // Mean LM loss over up to `batches` microbatches of the held-out split per rank (collective);
  // nullopt when the held-out split has no full microbatch. A non-finite mean is returned as is.
  std::optional<double> evaluate(int64_t batches);
  // The same over each named validation set ([[eval.sets]]), as (name, mean loss).
  std::vector<std::pair<std::string, double>> evaluate_sets(int64_t batches);

  // Mean LM loss of the first microbatch of training step `step` under the current weights
  // (forward only; collective). `bench --check` compares it across kernel choices.
  double microbatch_loss(int64_t step);

  // This rank's memory by role, as planned (memory_plan.h; `moetrain plan` computes the same).
  MemoryRoles memory_plan() const;
  const ParamRegistry& registry() const { return run_->reg; }
  Device device() const { return dev_; }
  ParamStore& store() { return *run_->store; }
  Transformer& model() { return *run_->model; }
  int rank() const { return world_.rank(); }

 private:
  void check_trains(const char* call) const;  // refuses `call` on an evaluation's trainer
  void load_checkpoint(const CheckpointReader& ckpt);
  void init_weights_from(const std::string& path);  // --init-from
  // Saves step's checkpoint (collective). background (train.async_save; periodic saves only): each
  // rank's file is written on a thread from a host copy, committed later by finish_background_save;
  // a save that is not in the background first finishes one that is.
  void save_checkpoint_now(int64_t step, bool background = false);
  // The parts of step's checkpoint: this rank's slices (on the GPU with null data, produced from
  // device_data) and, on rank 0, train_state.json.
  struct SaveParts {
    std::vector<CheckpointSlice> slices;
    std::vector<const void*> device_data;
    nlohmann::json train_state;
  };
  SaveParts save_parts(int64_t step);
  // Collective: whether every host has the memory for the host copies of its ranks' files, given
  // the bytes this rank's copy allocates anew (else the save runs in the foreground; rank 0 says
  // why, once).
  bool background_save_fits(size_t new_snapshot_bytes);
  // Collective. With a background save held: when every rank's file is written (or wait), gathers
  // the chunk records, commits the checkpoint on rank 0 and prunes, or fails on every rank naming
  // the rank whose write failed. Called at every step boundary while one is held.
  void finish_background_save(bool wait);
  // After a commit on rank 0: train.keep_last pruning and the "saved checkpoint" line.
  void after_commit(const std::string& dir, double seconds, size_t rss_before, const std::string& how);
  void fail_for_test(int64_t step) const;
  void upload_batch(int64_t step);           // host data -> the step's token buffers (before the step)
  void queue_gradients(int64_t step);        // zero, then every microbatch's forward + backward (no host reads)
  // queue_gradients + the optimizer (what a graph records); *optimizer_s: the CPU optimizer's time.
  void queue_step(int64_t step, const AdamWConfig& oc, double* optimizer_s);
  // Sums v over the world through the step-statistics buffer (v.size() <= its length).
  void all_reduce_host(std::vector<float>& v);
  void print_plan() const;
  // The training loop's output on stdout. Once a stop signal has reached this process it is held
  // back until the stop's checkpoint is committed (release_held_output): a SIGTERM to mpirun makes it
  // stop reading the ranks' output, and a print blocked on the full pipe would keep rank 0 from
  // saving before mpirun's kill.
  void say(const char* format, ...) __attribute__((format(printf, 2, 3)));
  void release_held_output();
  // Collective: every rank sees the run directory rank 0 claimed (throws on every rank if not).
  void check_run_dir_is_shared();
  // Mean LM loss over `count` windows, window(i, inputs, targets) filling window i; windows are
  // dealt to ranks round robin in whole microbatches, at most max_microbatches per rank (0 = all).
  using WindowFn = std::function<void(int64_t i, int32_t* inputs, int32_t* targets)>;
  EvalReport evaluate_windows(int64_t count, const WindowFn& window, int64_t max_microbatches,
                              const std::string& logits_npy);
  // The routing seed of one microbatch: random routing draws a fresh choice per (step, microbatch).
  static uint64_t routing_seed(uint64_t seed, int64_t step, int64_t micro);
  bool leader() const { return world_.rank() == 0; }
  // Data-parallel ranks of a stage and this rank's place among them (the whole job without pipeline).
  // Start-up: every [[eval.sets]] fills a microbatch on each data rank (else an error naming it);
  // a held-out split that does not is warned of (`warn`: this rank prints).
  void check_eval_sizes(bool warn) const;
  int64_t data_ranks() const { return run_->mesh ? run_->mesh->dp() : world_.size(); }
  int64_t data_rank() const { return run_->mesh ? run_->mesh->rank : world_.rank(); }
  // This rank's part of one microbatch's LM loss sum, forward only (pipeline: the last stage's).
  // With `logits` ([B*T, V] F32) given under pipeline stages, the last stage writes them there too.
  double forward_loss_sum(Tensor tokens, Tensor targets, uint64_t seed, const RoutingState& rs, Tensor logits = {});
  // Writes the logits of the job's first evaluated microbatch (data rank 0's) to `path` from rank 0.
  // Without pipeline stages they are computed here; under them, `logits` holds what the pass wrote
  // on the last stage's rank of data rank 0, which sends them to rank 0. Collective.
  void write_first_logits(const std::string& path, Tensor logits, Tensor tokens, uint64_t seed,
                          const RoutingState& rs);

  Config cfg_;
  TrainOptions opts_;
  Communicator& host_world_;  // the job's ranks on host buffers (checkpoint protocol)
  RunDevice run_device_;      // the device, and on the GPU the NCCL world the run uses
  Device dev_;
  MfuPeak peak_;              // the MFU denominator
  TimedCommunicator world_;   // every collective of the run goes through it (time in communication)
  FlopCount flops_;
  TokenDataset data_;
  std::unique_ptr<InstanceSampler> sampler_;             // data.sampling = "epoch"
  std::vector<std::unique_ptr<EvalWindows>> eval_sets_;  // [[eval.sets]], in config order
  Arena state_;
  Arena acts_;
  PassTimer pipeline_timer_;  // the pipeline phase of the last step (its bubble)
  SideStream pipeline_messages_;  // on the GPU, the stream the pipeline's stage messages run on
  std::vector<int32_t> host_tokens_, host_targets_;
  std::vector<float> host_bias_, host_load_;  // host copies of the router_bias and expert_load buffers
  size_t device_peak_bytes_ = 0;
  // The mesh, registry, store, dispatcher, model and step buffers (run_model.h); declared after
  // the arenas it reserves in, so it is destroyed before them.
  std::unique_ptr<RunModel> run_;
  // train.cuda_graph: the captured step. Declared after run_ (and the communicators before it) so
  // it is destroyed first: a graph holds NCCL's persistent plans of the collectives it captured,
  // and over NCCL's network transport ncclCommDestroy waits for them to be released (a job that
  // destroyed its communicators first hung at exit; bench/RESULTS.md, 2026-12-02 fourth session).
  std::unique_ptr<StepGraph> graph_;
  int64_t start_step_ = 0;
  // Training tokens through start_step_ (train_state.json's tokens_seen): a resume may change the
  // global batch or seq_len, so the count is carried, not step x today's tokens per step.
  int64_t tokens_at_start_ = 0;
  int64_t tokens_through(int64_t step) const {
    return tokens_at_start_ + (step - start_step_) * cfg_.train.global_batch_size * cfg_.train.seq_len;
  }
  int64_t skipped_steps_ = 0;      // in the whole run, resumes included
  std::string resumed_from_;       // the checkpoint this process started from ("" = fresh)
  std::string run_id_;             // stays the same across resumes (train_state.json)
  std::string resume_note_;  // "resumed from ..." (rank 0), printed by run() once run.dir is claimed
  std::string held_output_;  // say()'s text since a stop signal, printed once the stop's checkpoint is saved
  bool output_released_ = false;
  bool told_of_other_checkpoints_ = false;  // keep_last found another run's checkpoints (printed once)
  std::set<std::string> told_of_kept_checkpoints_;  // keep_last kept these for files they hold (said once each)
  nlohmann::json init_from_;       // where the run's first weights came from (null = its own init)
  std::optional<std::chrono::steady_clock::time_point> deadline_;  // train.max_duration, from run()
  // train.async_save: the checkpoint whose rank files are being written in the background.
  struct BackgroundSave {
    int64_t step = 0;
    std::string tmp_dir;
    nlohmann::json train_state;
    std::chrono::steady_clock::time_point started;
    double snapshot_s = 0;  // the host copy, in the foreground
    size_t rss_before = 0;
  };
  std::optional<BackgroundSave> background_save_;
  BackgroundRankFile background_file_;  // its destructor waits for a write still running
  bool told_save_in_foreground_ = false;  // background_save_fits said no (printed once)
};

}  // namespace moe

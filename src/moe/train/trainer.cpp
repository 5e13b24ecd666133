#include "moe/train/trainer.h"

#include <algorithm>
#include <cstdint>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "moe/ckpt/checkpoint.h"
#include "moe/ckpt/run_checkpoints.h"
#include "moe/comm/agreed_outcome.h"
#include "moe/core/device.h"
#include "moe/core/gpu_power.h"
#include "moe/core/local_rank.h"
#include "moe/core/rng.h"
#include "moe/core/wall_clock.h"
#include "moe/data/eval_windows.h"
#include "moe/data/instance_sampler.h"
#include "moe/data/prepare_lock.h"
#include "moe/model/router_bias.h"
#include "moe/ops/elementwise.h"
#include "moe/optim/lr_schedule.h"
#include "moe/train/config_agreement.h"
#include "moe/train/data_agreement.h"
#include "moe/train/init_source.h"
#include "moe/train/run_dir.h"
#include "moe/train/run_lock.h"
#include "moe/train/stop_request.h"

namespace fs = std::filesystem;

namespace moe {
namespace {

using Clock = SteadyClock;

// Every rank must run the same config; checked before the first collective that depends on it.
const Config& agreed(const Config& cfg, Communicator& host) {
  check_config_agrees(cfg, host);
  return cfg;
}

std::string new_run_id() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(std::time(nullptr));
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

Trainer::Trainer(const Config& cfg, const TrainOptions& opts, Communicator& world)
    : cfg_(agreed(cfg, world)),
      opts_(opts),
      host_world_(world),
      run_device_(choose_device(cfg, world)),
      dev_(run_device_.device),
      peak_(mfu_peak(cfg.run.peak_tflops, dev_)),
      world_(run_device_.gpu_world ? *run_device_.gpu_world : world, std::make_shared<double>(0.0)),
      flops_(count_flops(cfg.model, cfg.train.seq_len)),
      // Start-up errors every rank meets alike (a missing file, bad tokens, a config this world
      // size cannot run) are printed once (agreed_outcome.h).
      data_(agree_on_outcome(world,
                             [&] {
                               // One line per host for a wait there (node-local folders wait apart).
                               set_folder_wait_notices(world.rank() == 0 || local_rank() == 0);
                               return TokenDataset::open(cfg.data, cfg.model.vocab_size, cfg.model.eos_token_id);
                             })),
      state_("model state", dev_),
      acts_("activations", dev_),
      pipeline_timer_(dev_),
      pipeline_messages_(cfg.parallel.pp > 1 ? dev_ : Device::CPU) {
  background_file_.pin_for_gpu(dev_ == Device::CUDA);  // its host copies take GPU copies (async_save)
  int64_t dp = 1;
  agree_on_outcome(world, [&] {
    // First, while every rank is here: ranks that opened different token data (node-local copies
    // that differ, a folder changed between two ranks' listings) would each train on their own
    // windows without a word.
    check_same_token_data(world, token_data_summary(data_), "token data");
    dp = cfg_.parallel.dp(world_.size());  // refuses a pp that does not divide the ranks: printed once
    cfg_.validate(dp);
    check_run_layout(cfg_, world_.size());
    // Before anything is written: files too short for one window are left out (with a warning),
    // every named validation set is opened and checked.
    std::vector<std::string> warnings = data_.warnings();
    for (const std::string& w : data_.check_window(cfg_.train.seq_len)) warnings.push_back(w);
    for (const std::string& w : warnings)
      if (world.rank() == 0 && !opts_.quiet) std::fprintf(stderr, "warning: %s\n", w.c_str());
    if (cfg_.data.sampling == "epoch")
      sampler_ =
          std::make_unique<InstanceSampler>(data_, cfg_.train.seq_len, cfg_.train.global_batch_size, cfg_.data.seed);
    for (size_t k = 0; k < cfg_.eval.sets.size(); ++k)
      eval_sets_.push_back(std::make_unique<EvalWindows>(EvalWindows::open(
          cfg_.eval.sets[k].path, cfg_.data.format, token_dtype_from_name(cfg_.data.dtype), cfg_.train.seq_len,
          cfg_.model.vocab_size, 0, "eval.sets[" + std::to_string(k) + "].path")));
    MOE_CHECK(!cfg_.train.cuda_graph || dev_ == Device::CUDA,
              "train.cuda_graph = true needs the GPU, but this run uses ", run_device_.note);
    MOE_CHECK(!cfg_.train.cuda_graph || cfg_.parallel.mode != "fsdp",
              "train.cuda_graph = true with parallel.mode = \"fsdp\": the FSDP baseline runs eagerly (its per-block "
              "gathers are counted on the host); use parallel.mode = \"ddp\" or cuda_graph = false");
    MOE_CHECK(
        !cfg_.train.cuda_graph || cfg_.model.routing != Routing::Random,
        "train.cuda_graph = true with model.routing = \"random\": the routing draw is seeded per step by a launch "
        "argument, which a replayed graph would repeat; use learned or uniform routing, or cuda_graph = false");
    if (cfg_.train.precision == Precision::FP8 && dev_ == Device::CUDA) {
      const GpuInfo gpu = current_gpu();
      MOE_CHECK(gpu.major == 9,
                "train.precision = \"fp8\" runs on Hopper GPUs (compute capability 9.x: FP8 tensor "
                "cores with the block-scaled kernels built here); this GPU, ",
                gpu.name, ", is ", gpu.major, ".", gpu.minor,
                "; set train.precision = \"bf16\" or run.device = \"cpu\" (FP8 emulated)");
      check_fp8_gpu_shapes(cfg_);
    }
  });
  // The named validation sets alike, once every rank has opened them (a rank that failed to has
  // ended the block above on every rank).
  for (size_t k = 0; k < eval_sets_.size(); ++k)
    agree_on_outcome(world, [&] {
      check_same_token_data(world, token_data_summary(*eval_sets_[k]),
                            "token data for eval.sets[" + std::to_string(k) + "]");
    });
  const StoreUse use = opts_.evaluation_only ? StoreUse::Evaluation : StoreUse::Training;
  run_ = build_run_model(cfg_, world_, dev_, run_device_.gpu_world != nullptr, state_, acts_, use);
  if (!opts_.bench && !opts_.checkpoint && cfg_.train.eval_batches > 0)
    agree_on_outcome(world, [&] { check_eval_sizes(world.rank() == 0 && !opts_.quiet); });
  // Fail before any work when the plan cannot fit in this machine's (or this GPU's) memory, saying
  // what would (memory_plan.h). On the GPU the dispatcher's heap is allocated by now: the free
  // memory no longer counts it.
  size_t limit = physical_memory_bytes();
  if (dev_ == Device::CUDA) {
    const DeviceMemory m = device_memory();
    limit = m.free_bytes > kLibraryReserveBytes ? m.free_bytes - kLibraryReserveBytes : 1;
  }
  // Test hook (startup_errors_print_once.sh): this rank's memory, in MiB, as if it had only that.
  if (const char* mib = std::getenv("MOE_TEST_MEMORY_MIB")) limit = static_cast<size_t>(std::atoll(mib)) << 20;
  if (world.size() > 1) {
    // The smallest over the ranks (in whole MiB), so that ranks of one plan check one figure and a
    // config that does not fit is one error, printed once, not one per GPU with its own free bytes.
    int32_t neg_mib = -static_cast<int32_t>(std::min<size_t>(limit >> 20, INT32_MAX));
    world.all_reduce(Tensor(&neg_mib, DType::I32, {1}), ReduceOp::Max);
    limit = std::min(limit, static_cast<size_t>(-static_cast<int64_t>(neg_mib)) << 20);
  }
  const MemoryRoles plan = memory_roles(state_, acts_, *run_);
  const size_t usable = limit + (dev_ == Device::CUDA ? plan.heap : 0);
  // Ranks plan different bytes (pipeline stages, shard remainders): when one does not fit, every
  // rank names the largest rank's plan (plan_largest_rank, the same on every rank), so the error is
  // one, printed once, with the figures `moetrain plan` prints, not each rank's own.
  int32_t over = plan.total() > usable ? 1 : 0;
  if (world.size() > 1) world.all_reduce(Tensor(&over, DType::I32, {1}), ReduceOp::Max);
  agree_on_outcome(world, [&] {
    if (!over) return;
    const MemoryRoles largest = world.size() > 1 ? plan_largest_rank(cfg_, world_.size(), dev_, use) : plan;
    MOE_FAIL(does_not_fit_message(cfg_, largest, world_.size(), dev_,
                                  limit + (dev_ == Device::CUDA ? largest.heap : 0), use));
  });
  state_.commit(limit);
  acts_.commit(limit > state_.total_bytes() ? limit - state_.total_bytes() : 1);
  // The host's copies of a step's batch, only now that the plan fits: it counts the arena's copy
  // (batch.tokens, batch.targets) and, on the CPU, these (memory_roles), so an absurd batch is
  // refused by the plan before it is allocated here.
  const int64_t tokens = cfg_.accumulation_steps(dp) * cfg_.train.micro_batch_size * cfg_.train.seq_len;
  const int64_t LN = cfg_.model.num_hidden_layers * cfg_.model.num_experts;
  host_tokens_.resize(static_cast<size_t>(tokens));
  host_targets_.resize(static_cast<size_t>(tokens));
  host_bias_.assign(static_cast<size_t>(LN), 0.0f);
  host_load_.assign(static_cast<size_t>(LN), 0.0f);
  run_->store->init(cfg_.train.seed);
  if (opts_.checkpoint) {
    resumed_from_ = opts_.checkpoint->dir();
    load_checkpoint(*opts_.checkpoint);
  } else if (!opts_.init_from.empty()) {
    // A bench neither resumes nor writes run.dir, which is all the conflicts are about.
    const std::string conflict = opts_.bench ? "" : init_from_conflict(opts_.init_from, opts_.resume, cfg_);
    MOE_CHECK(conflict.empty(), conflict);
    init_weights_from(opts_.init_from);
  } else {
    // A live run in run.dir is named before its checkpoints are read (it may have none yet).
    // Rank 0 asks (it takes the lock itself only later, in run(): another rank asking could
    // see rank 0's own lock of a fast start) and tells every rank.
    if (!opts_.bench) {
      const std::string lock = cfg_.run_dir() + "/.lock";
      const std::string who = broadcast_string(host_world_, leader() ? run_lock_holder(lock) : "", 0);
      MOE_CHECK_AGREED(who.empty(), "the run directory is in use by ", who, " (", lock,
                       "); wait for it to end, or choose another run.dir");
    }
    resumed_from_ = agree_on_outcome(
        world, [&] { return opts_.bench && opts_.resume.empty() ? "" : resume_source(opts_.resume, cfg_); });
    if (!resumed_from_.empty())
      load_checkpoint(agree_on_outcome(world, [&] { return CheckpointReader(resumed_from_); }));
  }
  if (run_id_.empty()) run_id_ = new_run_id();
  // Each rank reads and verifies only its own ranges of a checkpoint (one agreed outcome: a corrupt
  // range is every rank's error). Rank 0 claims run.dir in run() (it may set the previous run or
  // later checkpoints aside): only once every rank is past this point.
  host_world_.barrier();
}

Trainer::~Trainer() = default;

void Trainer::check_eval_sizes(bool warn) const {
  // An evaluation runs whole microbatches on every data-parallel rank; one that fills none would
  // report a loss of zero (a named set) or nothing at all (the held-out split).
  const int64_t B = cfg_.train.micro_batch_size, T = cfg_.train.seq_len, dp = data_ranks(), need = B * dp;
  for (size_t k = 0; k < eval_sets_.size(); ++k) {
    const int64_t have = eval_sets_[k]->size();
    MOE_CHECK(have >= need, "eval.sets[", k, "] '", cfg_.eval.sets[k].name, "' (", cfg_.eval.sets[k].path, "): ", have,
              " windows of ", T + 1, " tokens fill no microbatch of ", B, " sequences on each of the ", dp,
              " data-parallel ranks (at least ", need, " windows, ", need * (T + 1), " tokens); give it more data, or ",
              "lower train.micro_batch_size or train.seq_len");
  }
  const int64_t held_out = data_.eval_num_sequences(T);
  if (warn && held_out < need) {
    const bool synthetic = data_.attainable_loss().has_value();
    std::fprintf(stderr,
                 "warning: the held-out split holds %ld windows of %ld tokens, fewer than one microbatch on each "
                 "data-parallel rank (%ld): no held-out loss will be reported; raise %s, or set "
                 "train.eval_batches = 0\n",
                 static_cast<long>(held_out), static_cast<long>(T + 1), static_cast<long>(need),
                 synthetic ? "data.synthetic_eval_tokens" : "data.eval_fraction");
  }
}

uint64_t Trainer::routing_seed(uint64_t seed, int64_t step, int64_t micro) {
  return hash_counters(seed, 0x726f757465ull, static_cast<uint64_t>(step), static_cast<uint64_t>(micro));
}

void Trainer::check_run_dir_is_shared() {
  if (host_world_.size() == 1) return;
  // Every rank writes its checkpoint file into run.dir: a rank that does not see rank 0's lock
  // file there would find out only at the first save, after all the training before it.
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string lock = cfg_.run_dir() + "/.lock";
  const std::string expected = broadcast_string(host_world_, leader() ? read(lock) : "", 0);
  int32_t blind = !expected.empty() && read(lock) == expected ? 0 : host_world_.rank() + 1;
  host_world_.all_reduce(Tensor(&blind, DType::I32, {1}), ReduceOp::Max);
  MOE_CHECK_AGREED(blind == 0, "rank ", blind - 1, " does not see run.dir '", cfg_.run_dir(), "' as rank 0 does (its ",
                   lock,
                   " is missing or another file): every rank writes its checkpoint there, so it must be one folder "
                   "on a filesystem all ranks share");
}

MemoryRoles Trainer::memory_plan() const { return memory_roles(state_, acts_, *run_); }

void Trainer::print_plan() const {
  const double tokens_per_step = static_cast<double>(cfg_.train.global_batch_size * cfg_.train.seq_len);
  std::printf("moetrain: config '%s', %s parameters (%s active per token, capacity ratio %.2f)\n", cfg_.name.c_str(),
              format_count(flops_.total_params).c_str(), format_count(flops_.active_params).c_str(),
              flops_.total_params / flops_.active_params);
  std::printf("  %s\n", data_.describe().c_str());
  if (sampler_) std::printf("  %s\n", sampler_->describe().c_str());
  for (size_t k = 0; k < eval_sets_.size(); ++k)
    std::printf("  eval set '%s': %s (%ld windows of %ld tokens)\n", cfg_.eval.sets[k].name.c_str(),
                cfg_.eval.sets[k].path.c_str(), static_cast<long>(eval_sets_[k]->size()),
                static_cast<long>(cfg_.train.seq_len + 1));
  if (cfg_.parallel.mode == "fsdp")
    std::printf("  parallel: fsdp over %d ranks (every parameter sharded; full weights gathered per block)\n",
                world_.size());
  else
    std::printf("  parallel: %d ranks, ep %d (%s dispatch), expert replicas %d\n", world_.size(), run_->mesh->ep,
                run_->dispatcher->name(), run_->mesh->ep_dp);
  if (const PipelinePlan* p = run_->pipeline.get())
    std::printf(
        "  pipeline: %d stages x %ld data-parallel ranks, %s schedule, %d chunks per rank, layers per chunk "
        "%s; %d microbatches in flight on stage 0; theoretical bubble %.1f%%\n",
        p->shape.stages, static_cast<long>(data_ranks()), cfg_.parallel.pp_schedule.c_str(), p->shape.virtual_stages,
        p->layout.describe().c_str(), p->activation_sets, 100 * theoretical_bubble(p->schedule, p->shape));
  std::printf("  batch: %ld sequences x %ld tokens per step, %ld microbatches of %ld per rank; %s FLOPs per token\n",
              static_cast<long>(cfg_.train.global_batch_size), static_cast<long>(cfg_.train.seq_len),
              static_cast<long>(cfg_.accumulation_steps(data_ranks())), static_cast<long>(cfg_.train.micro_batch_size),
              format_count(flops_.flops_per_token).c_str());
  auto b = [](size_t n) { return format_bytes(static_cast<double>(n)); };
  const MemoryRoles m = memory_plan();
  std::printf("  device: %s; MFU against %.4g TFLOP/s (%s)\n", run_device_.note.c_str(), peak_.tflops,
              peak_.source.c_str());
  std::printf(
      "  memory plan (%s, %.0f tokens/step): parameters %s (FP32), compute weights %s (%s), gradients %s, "
      "optimizer %s, other state %s; activations %s (expert buffers %s; recompute %s; precision %s); "
      "total %s\n",
      std::string(device_name(dev_)).c_str(), tokens_per_step, b(m.parameters).c_str(), b(m.compute_weights).c_str(),
      cfg_.train.precision != Precision::FP8 ? "BF16 copy"
      : dev_ == Device::CUDA                 ? "FP8 caches and a BF16 copy of the unquantized tensors"
                                             : "FP8 caches",
      b(m.gradients).c_str(), b(m.optimizer).c_str(), b(m.other_state).c_str(), b(m.activations).c_str(),
      b(m.expert_buffers).c_str(), to_string(cfg_.train.recompute), to_string(cfg_.train.precision),
      b(m.total()).c_str());
  // Moments per parameter: 8 bytes (FP32) or 4 (BF16) unsharded; the shards leave this rank its part.
  const size_t moments = state_.bytes_with_prefix("optimizer.exp_avg") + state_.bytes_with_prefix("fsdp.exp_avg");
  std::printf(
      "  optimizer: AdamW moments in %s (optim.moment_dtype), %zu bytes per parameter; this rank stores "
      "%.2f bytes per parameter it holds (%s)\n",
      std::string(dtype_name(cfg_.optim.moment_dtype)).c_str(), 2 * dtype_size(cfg_.optim.moment_dtype),
      static_cast<double>(moments) / static_cast<double>(std::max<int64_t>(1, run_->reg.total_numel())),
      cfg_.parallel.mode == "fsdp" ? "FSDP shards" : "ZeRO-1 shards over each replica group");
  if (run_->dispatcher->heap_bytes() > 0)
    std::printf("  (expert buffers in the %s dispatcher's symmetric heap: %s per rank, outside the arenas)\n",
                run_->dispatcher->name(), b(run_->dispatcher->heap_bytes()).c_str());
  if (m.library_workspace > 0)
    std::printf("  (train.deterministic: cuDNN's deterministic attention backward holds %s, outside the arenas)\n",
                b(m.library_workspace).c_str());
  std::fflush(stdout);
}

void Trainer::upload_batch(int64_t step) {
  const TrainConfig& t = cfg_.train;
  const int64_t dp = data_ranks(), rank = data_rank();
  const int64_t B = t.micro_batch_size, T = t.seq_len, accum = cfg_.accumulation_steps(dp);
  for (int64_t micro = 0; micro < accum; ++micro) {
    // Global sequences of this microbatch: the same global batch in the same order on any topology.
    int32_t* in = host_tokens_.data() + micro * B * T;
    int32_t* tg = host_targets_.data() + micro * B * T;
    if (sampler_)
      sampler_->batch(step, (micro * dp + rank) * B, B, in, tg);
    else
      data_.train_batch(step, (micro * dp + rank) * B, B, T, in, tg);
  }
  copy_to_tensor(state_.get(run_->buffers.tokens), host_tokens_.data());
  copy_to_tensor(state_.get(run_->buffers.targets), host_targets_.data());
}

void Trainer::queue_gradients(int64_t step) {
  const TrainConfig& t = cfg_.train;
  const int64_t dp = data_ranks(), rank = data_rank();
  const int64_t rows = t.micro_batch_size * t.seq_len, accum = cfg_.accumulation_steps(dp);
  const int64_t moe_layers = cfg_.model.num_hidden_layers - cfg_.model.first_k_dense_replace;
  // Every rank scales by the global batch, so the reduced gradient is that of the global mean loss.
  StepScales scales;
  scales.lm_grad_scale = 1.0f / static_cast<float>(t.global_batch_size * t.seq_len);
  // Test hook: from step MOE_TEST_NONFINITE_FROM_STEP on, every gradient is NaN (a diverged model,
  // on demand: the skip and give-up paths are tested without searching for a divergent config).
  if (const char* from = std::getenv("MOE_TEST_NONFINITE_FROM_STEP"); from && step + 1 >= std::atoll(from))
    scales.lm_grad_scale = std::nanf("");
  scales.aux_grad_scale = moe_layers > 0 ? 1.0f / static_cast<float>(accum * dp * moe_layers) : 0.0f;
  // On the GPU the first microbatch writes the expert gradients instead of adding them (the CPU
  // keeps its bit-exact accumulation order: 0 + (-0) is +0), so only the dense ones need zeros.
  // One flag for both decisions: a store that skips the zeros relies on that write.
  // A pipeline's microbatches pass through a stage's layers in the schedule's order, not one after
  // another, so its gradients are always added to zeros.
  const bool first_microbatch_writes_experts = dev_ == Device::CUDA && !run_->pipeline;
  run_->store->zero_grads(first_microbatch_writes_experts);
  Tensor load = state_.get(run_->buffers.expert_load), stats = state_.get(run_->buffers.step_stats);
  fill_zero(load);
  fill_zero(stats);
  RoutingState rs{state_.get(run_->buffers.router_bias), load};
  const Tensor tokens = state_.get(run_->buffers.tokens), targets = state_.get(run_->buffers.targets);
  if (run_->pipeline) {
    PipelineStepInput in;
    in.tokens = tokens;
    in.targets = targets;
    in.rows = rows;
    in.scales = scales;  // gradients are always added (gradients_zeroed = false)
    in.routing_seed = [&](int64_t micro) { return routing_seed(t.seed, step, micro * dp + rank); };
    in.routing = rs;
    in.stats = stats;
    run_pipeline_step(*run_->pipeline, *run_->mesh->pipeline, pipeline_messages_, *run_->model, *run_->store, in,
                      pipeline_timer_);
    return;
  }
  for (int64_t micro = 0; micro < accum; ++micro) {
    scales.gradients_zeroed = micro == 0 && first_microbatch_writes_experts;
    run_->store->begin_microbatch(micro == accum - 1);
    run_->model->forward_backward(
        run_->store->weights(), run_->store->grads(), tokens.rows(micro * rows, (micro + 1) * rows),
        targets.rows(micro * rows, (micro + 1) * rows), scales, routing_seed(t.seed, step, micro * dp + rank), rs);
    run_->model->add_stats(stats);
  }
}

// Test hook (tests/cli/stop_test.cpp): after step MOE_TEST_AWAIT_STOP_AFTER_STEP's record, wait
// (60 s at most) for a stop signal, so that a test's signal arrives at a known step however loaded
// the machine is. The next step's statistics carry it: the run stops after that step.
static void await_stop_for_test(int64_t step) {
  static const char* const after = std::getenv("MOE_TEST_AWAIT_STOP_AFTER_STEP");
  if (!after || std::atoll(after) != step) return;
  std::fprintf(stderr, "test hook MOE_TEST_AWAIT_STOP_AFTER_STEP: waiting up to 60 s for a stop signal\n");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (stop_signal() == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

// Test hook: make one rank fail in the middle of a step (the job must end, not hang).
void Trainer::fail_for_test(int64_t step) const {
  if (const char* r = std::getenv("MOE_TEST_FAIL_ON_RANK"); r && std::atoi(r) == world_.rank() && step == 1)
    MOE_FAIL("test hook MOE_TEST_FAIL_ON_RANK: rank ", world_.rank(), " fails in step ", step + 1);
}

void Trainer::accumulate_gradients(int64_t step) {
  check_trains("accumulate_gradients");
  fail_for_test(step);
  upload_batch(step);
  queue_gradients(step);
}

void Trainer::queue_step(int64_t step, const AdamWConfig& oc, double* optimizer_s) {
  queue_gradients(step);
  const auto t_opt = Clock::now();
  // On the GPU, AdamW reads lr and step from memory so that a replayed graph sees this step's values.
  run_->store->enqueue_step(oc, static_cast<float>(cfg_.train.grad_clip), step + 1,
                            dev_ == Device::CUDA ? state_.get(run_->buffers.schedule) : Tensor());
  // GPU work is asynchronous: the host time of queueing it says nothing (bench splits the GPU step by kernel).
  if (optimizer_s && dev_ == Device::CPU) *optimizer_s = seconds_since(t_opt);
}

void Trainer::all_reduce_host(std::vector<float>& v) {
  const Tensor stats = state_.get(run_->buffers.step_stats);
  MOE_CHECK(static_cast<int64_t>(v.size()) <= stats.numel(), "all_reduce_host: ", v.size(), " values, room for ",
            stats.numel());
  const Tensor part = stats.rows(0, static_cast<int64_t>(v.size()));
  copy_to_tensor(part, v.data());
  world_.all_reduce(part, ReduceOp::Sum);
  copy_from_tensor(v.data(), part);
}

StepRecord Trainer::train_step(int64_t step) {
  check_trains("train_step");
  const TrainConfig& t = cfg_.train;
  const int64_t dp = data_ranks(), T = t.seq_len, accum = cfg_.accumulation_steps(dp);
  const auto t0 = Clock::now();
  const double comm_before = world_.seconds();
  const int64_t bytes_before = run_->dispatcher->bytes_moved();
  StepRecord r;
  r.step = step + 1;
  r.lr = lr_at(step, t.steps, t.lr, t.warmup_steps, t.min_lr_ratio, t.lr_schedule, t.decay_steps);
  AdamWConfig oc;
  oc.lr = static_cast<float>(r.lr);
  oc.beta1 = static_cast<float>(t.beta1);
  oc.beta2 = static_cast<float>(t.beta2);
  oc.eps = static_cast<float>(t.eps);
  oc.weight_decay = static_cast<float>(t.weight_decay);
  fail_for_test(step);
  upload_batch(step);
  if (dev_ == Device::CUDA) {
    const float schedule[2] = {static_cast<float>(r.lr), static_cast<float>(step + 1)};
    copy_to_tensor(state_.get(run_->buffers.schedule), schedule);
  }
  const double reduction_wait_before = run_->store->reduction_wait_s();
  if (!t.cuda_graph) {
    queue_step(step, oc, &r.optimizer_time_s);
  } else {
    // The first step runs eagerly (it builds the cuBLASLt and cuDNN plans and workspaces, which
    // cannot be created during a capture); the second is captured; every later one replays it.
    if (step > start_step_ && !graph_) {
      graph_ = std::make_unique<StepGraph>();
      graph_->capture([&] { queue_step(step, oc, nullptr); });
    }
    if (graph_)
      graph_->replay();
    else
      queue_step(step, oc, nullptr);
  }
  // After the step: one read of its statistics (this waits for the device), then the collectives.
  std::vector<float> st(kNumStepStats, 0.0f);
  copy_from_tensor(st.data(), state_.get(run_->buffers.step_stats).rows(0, kNumMicrobatchStats));
  run_->dispatcher
      ->check_after_step();  // the GPU dispatcher's count check and byte counters, read now the device is idle
  // This rank's MoE layers (a pipeline stage's share; summed over the job below).
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < cfg_.model.num_hidden_layers; ++l)
    moe_layers +=
        cfg_.model.is_moe_layer(l) && run_->reg.has("model.layers." + std::to_string(l) + ".mlp.gate.weight") ? 1 : 0;
  st[kRoutes] = static_cast<float>(accum * t.micro_batch_size * T * cfg_.model.num_experts_per_tok * moe_layers);
  st[kCapacity] = static_cast<float>(accum * run_->model->expert_rows() * moe_layers);
  st[kBytesMoved] = static_cast<float>(run_->dispatcher->bytes_moved() - bytes_before);
  st[kStopSignals] = stop_signal() != 0 ? 1.0f : 0.0f;
  // Rank 0's clock decides for everyone: stop when the next step would end past the budget.
  st[kStopDeadline] = leader() && deadline_ && Clock::now() + (Clock::now() - t0) > *deadline_ ? 1.0f : 0.0f;
  st[kPipelineBubble] = run_->pipeline ? static_cast<float>(pipeline_timer_.read().idle()) : 0.0f;
  const ParamStore::StepResult opt = run_->store->last_step();
  all_reduce_host(st);
  const Tensor load = state_.get(run_->buffers.expert_load);
  world_.all_reduce(load, ReduceOp::Sum);  // every rank sees the global expert load (bias update, metrics)
  copy_from_tensor(host_load_.data(), load);
  r.comm_time_s = world_.seconds() - comm_before;
  if (dev_ == Device::CPU) r.reduction_wait_time_s = run_->store->reduction_wait_s() - reduction_wait_before;
  r.skipped = opt.skipped;
  if (opt.skipped) {
    ++skipped_steps_;
  } else if (cfg_.model.bias_update_rate > 0 && cfg_.model.routing == Routing::Learned) {
    update_router_bias(host_bias_, host_load_, cfg_.model);
    copy_to_tensor(state_.get(run_->buffers.router_bias), host_bias_.data());  // between steps, read by the next one
  }
  r.step_time_s = seconds_since(t0);
  if (dev_ == Device::CUDA) {
    const DeviceMemory m = device_memory();
    device_peak_bytes_ = std::max(device_peak_bytes_, m.total_bytes - m.free_bytes);
  }
  r.lm_loss = st[kLmSum] / static_cast<double>(t.global_batch_size * T);
  r.lb_loss = st[kLb] / static_cast<double>(accum * dp);
  r.z_loss = st[kZ] / static_cast<double>(accum * dp);
  r.loss = r.lm_loss + cfg_.model.router_aux_loss_coef * r.lb_loss + cfg_.model.router_z_loss_coef * r.z_loss;
  r.grad_norm = opt.grad_norm;
  r.tokens_per_s = static_cast<double>(t.global_batch_size * T) / r.step_time_s;
  r.mfu = mfu(flops_, r.tokens_per_s, peak_, static_cast<double>(world_.size()));
  if (const PipelinePlan* p = run_->pipeline.get()) {
    r.pipeline_bubble = st[kPipelineBubble] / static_cast<double>(world_.size());  // the mean over ranks
    r.pipeline_bubble_theory = theoretical_bubble(p->schedule, p->shape);
  }
  // Routes sent minus rows kept, summed over the world: the routes dropped by capacity.
  r.dropped_fraction = st[kRoutes] > 0 ? (st[kRoutes] - st[kReceived]) / st[kRoutes] : 0.0;
  r.receive_utilization = st[kCapacity] > 0 ? st[kReceived] / st[kCapacity] : 0.0;
  r.dispatch_bytes = st[kBytesMoved];
  if (st[kStopSignals] > 0)
    r.stop_reason = stop_signal() != 0 ? std::string(signal_name(stop_signal())) : "a stop signal on another rank";
  else if (st[kStopDeadline] > 0)
    r.stop_reason = "train.max_duration = \"" + t.max_duration + "\" reached";
  const int64_t N = cfg_.model.num_experts;
  for (int64_t l = 0; l < cfg_.model.num_hidden_layers; ++l) {
    if (!cfg_.model.is_moe_layer(l)) continue;
    const float* c = host_load_.data() + l * N;
    double mx = 0, mean = 0;
    for (int64_t e = 0; e < N; ++e) mx = std::max(mx, static_cast<double>(c[e])), mean += c[e];
    mean /= static_cast<double>(N);
    const double ratio = mean > 0 ? mx / mean : 0.0;
    r.expert_load_per_layer.push_back(ratio);
    r.expert_load_max_over_mean = std::max(r.expert_load_max_over_mean, ratio);
  }
  return r;
}

void Trainer::check_trains(const char* call) const {
  MOE_CHECK(!opts_.evaluation_only, "Trainer::", call,
            ": this trainer was built for evaluation (no gradients or optimizer state)");
}

TrainSummary Trainer::run() {
  check_trains("run");
  const TrainConfig& t = cfg_.train;
  TrainSummary summary;
  summary.first_step = start_step_;
  summary.planned_steps = t.steps;
  summary.attainable_loss = data_.attainable_loss();
  // A new run of no steps would claim run.dir and leave only its config.toml: no checkpoint, nothing
  // to resume (every rank has the same values: one error, printed once).
  if (!opts_.bench && resumed_from_.empty())
    agree_on_outcome(host_world_, [&] {
      MOE_CHECK(t.steps > 0, "train.steps = 0: a new run trains at least one step (set train.steps, or --steps)");
    });
  // Rank 0 claims the run directory only now: config, data and any checkpoint are validated. It
  // takes the lock first; the claim (setting aside, config.toml) waits until every rank has seen
  // that lock, so a run.dir the ranks do not share moves and writes nothing.
  std::unique_ptr<RunDirectory> run_dir;
  if (!opts_.bench) {
    const RunStart start{resumed_from_, start_step_, opts_.overwrite, cfg_.run.resume == "auto", opts_.config_file};
    leader_decides(host_world_, [&] {
      run_dir = std::make_unique<RunDirectory>(cfg_, start);
      return std::string();
    });
    check_run_dir_is_shared();
    leader_decides(host_world_, [&] {
      if (run_dir) run_dir->claim(cfg_, start);
      return std::string();
    });
  }
  if (run_dir) {
    if (!run_dir->set_aside().empty() && !opts_.quiet) {
      if (run_dir->replaced_previous_run())
        std::printf("--overwrite: moved the previous run in %s to %s\n", run_dir->path().c_str(),
                    run_dir->set_aside().c_str());
      else
        std::printf("moved what came after step %ld in %s aside to %s\n", static_cast<long>(start_step_),
                    run_dir->path().c_str(), run_dir->set_aside().c_str());
    }
  }
  // An error while a checkpoint is written in the background (train.async_save): in one process it
  // is still committed, before run_dir's lock is released (nothing else takes part); with several
  // ranks the others may have gone, so its temp folder is left for the next start to clear.
  struct CommitOnError {
    Trainer& trainer;
    const int uncaught = std::uncaught_exceptions();
    ~CommitOnError() {
      if (std::uncaught_exceptions() == uncaught || !trainer.background_save_ || trainer.host_world_.size() != 1)
        return;
      try {
        trainer.finish_background_save(/*wait=*/true);
      } catch (const std::exception&) {
        // The error being reported is the run's; this save's own failure cannot replace it.
      }
    }
  } commit_on_error{*this};
  if (!resume_note_.empty()) std::fputs(resume_note_.c_str(), stdout);
  const bool talk = leader() && !opts_.quiet;
  if (talk) print_plan();
  const double dp = static_cast<double>(world_.size());
  const double tokens_per_step = static_cast<double>(t.global_batch_size * t.seq_len);
  const double ideal_step_s = flops_.flops_per_token * tokens_per_step / (peak_.tflops * 1e12 * dp);
  double comm_s = 0, opt_s = 0, reduce_wait_s = 0;
  const auto run_start = Clock::now();
  if (const double budget = parse_duration(t.max_duration, "train.max_duration"); budget > 0)
    deadline_ = run_start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(budget));
  double timed_s = 0;
  int64_t timed_steps = 0, consecutive_skipped = 0, skipped_here = 0;
  int64_t last_saved = start_step_;
  const bool profile =
      dev_ == Device::CUDA && opts_.profiler != nullptr && opts_.profiler->available() && t.steps - start_step_ > 1;
  const bool watch_power =
      dev_ == Device::CUDA && opts_.power != nullptr && opts_.power->available() && t.steps - start_step_ > 1;
  if (opts_.stop_on_signals) install_stop_handlers();
  for (int64_t step = start_step_; step < t.steps; ++step) {
    if (profile && step == start_step_ + 1) opts_.profiler->start();  // the first step builds plans: not timed
    // A GPU whose readings fail gets no power line, not a failed run (bench prints why).
    if (watch_power && step == start_step_ + 1) opts_.power->start();
    StepRecord r = train_step(step);
    summary.steps.push_back(r);
    if (step > start_step_) {
      timed_s += r.step_time_s, comm_s += r.comm_time_s, opt_s += r.optimizer_time_s;
      reduce_wait_s += r.reduction_wait_time_s;
      ++timed_steps;
    }
    consecutive_skipped = r.skipped ? consecutive_skipped + 1 : 0;
    skipped_here += r.skipped ? 1 : 0;
    const bool give_up = t.max_skipped_steps > 0 && consecutive_skipped >= t.max_skipped_steps;
    const bool last = r.step == t.steps;
    const bool log = r.step % t.log_every == 0 || last || step == start_step_ || r.skipped || give_up;
    std::optional<double> eval;
    std::vector<std::pair<std::string, double>> eval_sets;
    if (!opts_.bench && !give_up && t.eval_every > 0 && t.eval_batches > 0 && (r.step % t.eval_every == 0 || last)) {
      eval = evaluate(t.eval_batches);
      eval_sets = evaluate_sets(t.eval_batches);
      if (last) summary.eval_loss = eval, summary.eval_sets = eval_sets;  // the final evaluation; not repeated below
    }
    if (log || eval || !eval_sets.empty()) {
      const double elapsed = seconds_since(run_start);
      const double eta = elapsed / static_cast<double>(step - start_step_ + 1) * static_cast<double>(t.steps - r.step);
      if (talk) {
        say("step %5ld/%ld | loss %.4f (lm %.4f lb %.3f z %.3f) | gnorm %.3f | lr %.2e | %s tok/s | MFU %.2f%% | %.0f "
            "ms/step | ETA %s%s\n",
            static_cast<long>(r.step), static_cast<long>(t.steps), r.loss, r.lm_loss, r.lb_loss, r.z_loss, r.grad_norm,
            r.lr, format_count(r.tokens_per_s).c_str(), 100 * r.mfu, 1000 * r.step_time_s, format_duration(eta).c_str(),
            r.skipped ? " | SKIPPED (non-finite gradient)" : "");
        if (r.pipeline_bubble_theory > 0)
          say("  pipeline bubble %.1f%% measured, %.1f%% in theory\n", 100 * r.pipeline_bubble,
              100 * r.pipeline_bubble_theory);
        if (eval) say("  eval loss %.4f%s\n", *eval, std::isfinite(*eval) ? "" : " (not finite)");
        for (const auto& [name, loss] : eval_sets)
          say("  eval loss on %s %.4f%s\n", name.c_str(), loss, std::isfinite(loss) ? "" : " (not finite)");
      }
      if (run_dir) {
        RunTotals totals{ideal_step_s,
                         world_.size(),
                         skipped_steps_,
                         static_cast<double>(tokens_through(r.step)),
                         state_.total_bytes() + acts_.total_bytes(),
                         peak_rss_bytes(),
                         state_.total_bytes(),
                         acts_.total_bytes(),
                         run_->dispatcher->heap_bytes(),
                         device_peak_bytes_};
        nlohmann::json j = step_record_json(r, totals, eval, eval_sets);
        j["time"] = utc_time("%Y-%m-%dT%H:%M:%SZ");
        j["run_id"] = run_id_;
        run_dir->write_record(j);  // metrics.jsonl and, with run.tensorboard, the TensorBoard events
      }
    }
    await_stop_for_test(r.step);
    // Skipped steps leave the weights as they were; a run that keeps skipping has diverged. Its
    // error points to the last checkpoint: one still being written is committed first.
    if (give_up) finish_background_save(/*wait=*/true);
    MOE_CHECK_AGREED(
        !give_up, consecutive_skipped, " consecutive steps (up to step ", r.step,
        ") were skipped because their gradients were not finite (train.max_skipped_steps = ", t.max_skipped_steps,
        "); the model has diverged. Resume from an earlier checkpoint with a lower "
        "train.lr or a tighter train.grad_clip");
    // A stop's checkpoint is written before the process ends; a periodic one may go on in the
    // background (train.async_save) and is committed at a later step boundary.
    const bool stopping = !r.stop_reason.empty() && !last;
    if (!opts_.bench && ((t.save_every > 0 && r.step % t.save_every == 0) || stopping)) {
      save_checkpoint_now(r.step, /*background=*/t.async_save && !stopping);
      last_saved = r.step;
    }
    finish_background_save(/*wait=*/stopping);
    if (!r.stop_reason.empty() && !last) {
      summary.stop_reason = r.stop_reason;
      break;
    }
  }
  release_held_output();  // a stop's checkpoint is committed by now
  summary.last_step = summary.steps.empty() ? start_step_ : summary.steps.back().step;
  if (watch_power && opts_.power->running()) {
    device_synchronize();  // the window ends with its work (before the profiler's own flush)
    opts_.power->stop();
    summary.power = opts_.power->summary();
  }
  if (profile && opts_.profiler->recording()) opts_.profiler->stop();
  finish_background_save(/*wait=*/true);  // the run ends with every checkpoint it started committed
  MOE_CHECK_AGREED(
      skipped_here == 0 || skipped_here < t.steps - start_step_, "every step of this run (", skipped_here,
      ") was skipped because its gradients were not finite: nothing was learned. Lower train.lr or tighten "
      "train.grad_clip");
  if (!opts_.bench && cfg_.run.save_final && last_saved != t.steps && summary.last_step == t.steps &&
      t.steps > start_step_)
    save_checkpoint_now(t.steps);
  if (!opts_.bench && summary.stop_reason.empty() && t.eval_batches > 0 && !summary.eval_loss &&
      !(t.eval_every > 0 && t.steps > start_step_)) {
    summary.eval_loss = evaluate(t.eval_batches);
    summary.eval_sets = evaluate_sets(t.eval_batches);
  }
  summary.skipped_steps = skipped_steps_;
  // The first step builds plans and workspaces, so it is timed only when it is the only step run
  // (train.steps one past the start, or a stop after it).
  if (timed_steps == 0 && !summary.steps.empty()) {
    const StepRecord& first = summary.steps.front();
    timed_s = first.step_time_s, comm_s = first.comm_time_s, opt_s = first.optimizer_time_s;
    reduce_wait_s = first.reduction_wait_time_s;
    timed_steps = 1;
    summary.first_step_timed = true;
  }
  summary.timed_steps = timed_steps;
  if (timed_steps > 0) {
    summary.mean_step_time_s = timed_s / static_cast<double>(timed_steps);
    summary.mean_tokens_per_s = tokens_per_step / summary.mean_step_time_s;
    summary.mean_mfu = ideal_step_s / summary.mean_step_time_s;  // per device
    summary.mean_comm_time_s = comm_s / static_cast<double>(timed_steps);
    summary.mean_optimizer_time_s = opt_s / static_cast<double>(timed_steps);
    summary.mean_reduction_wait_time_s = reduce_wait_s / static_cast<double>(timed_steps);
  }
  summary.arena_bytes = state_.total_bytes() + acts_.total_bytes();
  summary.peak_rss_bytes = peak_rss_bytes();
  summary.device = dev_;
  summary.device_peak_bytes = device_peak_bytes_;
  summary.graph_nodes = graph_ ? graph_->nodes() : 0;
  summary.init_from = init_from_;
  return summary;
}

void Trainer::say(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::va_list again;
  va_copy(again, args);
  std::string text(static_cast<size_t>(std::max(std::vsnprintf(nullptr, 0, format, args), 0)), '\0');
  std::vsnprintf(text.data(), text.size() + 1, format, again);
  va_end(again);
  va_end(args);
  if (stop_signal() != 0 && !output_released_) {
    held_output_ += text;
    return;
  }
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

void Trainer::release_held_output() {
  output_released_ = stop_signal() != 0;  // from here on a stop's output goes out as it comes
  if (held_output_.empty()) return;
  std::fputs(held_output_.c_str(), stdout);
  std::fflush(stdout);
  held_output_.clear();
}

}  // namespace moe

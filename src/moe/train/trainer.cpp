#include "moe/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "moe/ckpt/checkpoint.h"
#include "moe/comm/nccl_communicator.h"
#include "moe/core/device.h"
#include "moe/data/npy.h"
#include "moe/core/rng.h"
#include "moe/ops/elementwise.h"
#include "moe/optim/lr_schedule.h"
#include "moe/parallel/ddp_store.h"
#include "moe/parallel/dispatcher_factory.h"
#include "moe/parallel/fsdp_store.h"
#include "moe/parallel/local_dispatcher.h"
#include "moe/train/metrics.h"

namespace fs = std::filesystem;

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Lines of `a` that differ from `b`, for the resume-refused message.
std::string config_diff(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  std::string la, lb, out;
  while (true) {
    const bool ga = static_cast<bool>(std::getline(sa, la)), gb = static_cast<bool>(std::getline(sb, lb));
    if (!ga && !gb) break;
    if (la != lb) out += "\n  checkpoint: " + (gb ? lb : "(none)") + "\n  this run:   " + (ga ? la : "(none)");
  }
  return out;
}

// The routing seed of one microbatch: random routing draws a fresh choice per (step, microbatch).
uint64_t routing_seed(uint64_t seed, int64_t step, int64_t micro) {
  return hash_counters(seed, 0x726f757465ull, static_cast<uint64_t>(step), static_cast<uint64_t>(micro));
}

// Device memory left out of the arenas' limit: cuBLASLt and cuDNN workspaces, the CUDA context.
constexpr size_t kLibraryReserveBytes = size_t{2} << 30;

// run.device: auto picks the GPU when this build has CUDA and one is usable (ddp or fsdp). Several
// ranks need NCCL (collectives, and the rowwise dispatcher's symmetric heap for parallel.ep > 1).
Device resolve_device(const Config& cfg, int world_size, std::string* note) {
  std::string why, nccl_why;
  const bool gpu = cuda_available(&why);
  const bool nccl = gpu && nccl_available(&nccl_why);
  const std::string& want = cfg.run.device;
  if (want == "cpu") {
    *note = "cpu (run.device)";
    return Device::CPU;
  }
  if (want == "auto") {
    std::string reason;
    if (!gpu)
      reason = why;
    else if (world_size > 1 && !nccl)
      reason = "several ranks on GPUs need NCCL: " + nccl_why;
    else if (world_size > 1 && cfg.parallel.ep > 1 && cfg.ep.backend != "rowwise")
      reason = "ep.backend = " + cfg.ep.backend + " runs on the CPU (the GPU has the rowwise backend)";
    if (!reason.empty()) {
      *note = "cpu (run.device = auto: " + reason + ")";
      return Device::CPU;
    }
  } else {
    MOE_CHECK(gpu, "run.device = \"cuda\", but ", why);
    MOE_CHECK(world_size == 1 || nccl, "run.device = \"cuda\" with ", world_size, " ranks needs NCCL: ", nccl_why);
  }
  if (world_size > 1) select_local_gpu();
  *note = std::string("cuda (") + (want == "auto" ? "run.device = auto" : "run.device") + "; collectives " +
          (nccl ? "through NCCL" : "in-process (one rank; NCCL: " + nccl_why + ")") + ")";
  return Device::CUDA;
}

// The MFU denominator: run.peak_tflops, or the device's dense BF16 (GPU) / nominal (CPU) peak.
double peak_tflops(const Config& cfg, Device dev, std::string* note) {
  if (cfg.run.peak_tflops > 0) {
    *note = "run.peak_tflops";
    return cfg.run.peak_tflops;
  }
  if (dev == Device::CPU) {
    *note = "the CPU default; set run.peak_tflops for your machine";
    return 0.2;
  }
  const GpuInfo g = current_gpu();
  MOE_CHECK(g.major == 9 && g.minor == 0, "no default MFU denominator for ", g.name, " (compute capability ", g.major,
            ".", g.minor, "); set run.peak_tflops to its dense BF16 peak in TFLOP/s");
  *note = "dense BF16 peak of an SXM Hopper GPU (" + g.name + "); set run.peak_tflops for other parts";
  return 989.0;
}

// The run's world on the GPU: NCCL over the job's ranks where available (one rank included, so a
// single-GPU run goes through the same collectives as a multi-GPU one).
std::unique_ptr<Communicator> make_gpu_world(Device dev, Communicator& world) {
  if (dev != Device::CUDA || !nccl_available()) return nullptr;
  return make_nccl_communicator(world);
}

}  // namespace

// Per-step statistics all-reduced over the world (one small collective per step). The first
// kNumMicrobatchStats are summed on the device by the model; the rest are known on the host.
enum StepStat {
  kLmSum = kStatLmSum,
  kLb = kStatLb,
  kZ = kStatZ,
  kReceived = kStatReceivedRows,
  kRoutes = kNumMicrobatchStats,
  kCapacity,
  kBytesMoved,
  kNumStepStats
};

Trainer::Trainer(const Config& cfg, const TrainOptions& opts, Communicator& world)
    : cfg_(cfg),
      opts_(opts),
      device_note_(),
      dev_(resolve_device(cfg, world.size(), &device_note_)),
      gpu_world_(make_gpu_world(dev_, world)),
      world_(gpu_world_ ? *gpu_world_ : world, std::make_shared<double>(0.0)),
      flops_(count_flops(cfg.model, cfg.train.seq_len)),
      data_(TokenDataset::open(cfg.data, cfg.model.vocab_size, cfg.model.eos_token_id)),
      state_("model state", dev_),
      acts_("activations", dev_) {
  const int dp = world_.size();
  cfg_.validate(dp);
  data_.check_window(cfg_.train.seq_len);  // before anything is written
  peak_tflops_ = peak_tflops(cfg_, dev_, &peak_note_);
  const ModelConfig& mc = cfg_.model;
  const bool fsdp = cfg_.parallel.mode == "fsdp";
  const int64_t moe_experts = mc.first_k_dense_replace < mc.num_hidden_layers ? mc.num_experts : 0;
  if (fsdp) {
    reg_ = build_registry(mc, 0, mc.num_experts, ParamLayout::ByBlock);
    store_ = std::make_unique<FsdpStore>(mc, reg_, world_, state_);
    dispatcher_ = std::make_unique<LocalDispatcher>(mc.num_experts, mc.capacity_factor, mc.dropless);
  } else {
    // A model without MoE layers has nothing to shard over experts: data parallelism only.
    MOE_CHECK(moe_experts > 0 || cfg_.parallel.ep == 1, "parallel.ep = ", cfg_.parallel.ep,
              " needs MoE layers, but model.first_k_dense_replace makes every layer dense; use parallel.ep = 1");
    mesh_ = std::make_unique<Mesh>(
        make_mesh(world_, static_cast<int>(cfg_.parallel.ep), moe_experts > 0 ? moe_experts : 1));
    const int64_t local = mc.num_experts / mesh_->ep;
    reg_ = build_registry(mc, mesh_->ep_index * local, local, ParamLayout::ByReplicaGroup);
    store_ = std::make_unique<DdpStore>(mc, reg_, *mesh_, state_);
    // GPU runs with NCCL: rows through NCCL symmetric windows with counts agreed on the device,
    // for any EP degree (EP = 1 goes through the same kernels as EP = 8). Without NCCL (one GPU,
    // a mismatched libnccl) and on the CPU, EP = 1 is the local dispatcher.
    if (dev_ == Device::CUDA && gpu_world_ && moe_experts > 0 && cfg_.ep.backend == "rowwise")
      dispatcher_ = make_gpu_dispatcher(cfg_.ep.backend, *mesh_->ep_group, mc.num_experts, mc.capacity_factor,
                                        mc.dropless);
    else if (mesh_->ep == 1)
      dispatcher_ = std::make_unique<LocalDispatcher>(mc.num_experts, mc.capacity_factor, mc.dropless);
    else if (dev_ == Device::CUDA)
      dispatcher_ = make_gpu_dispatcher(cfg_.ep.backend, *mesh_->ep_group, mc.num_experts, mc.capacity_factor,
                                        mc.dropless);
    else
      dispatcher_ = make_dispatcher(cfg_.ep.backend, *mesh_->ep_group, mc.num_experts, mc.capacity_factor,
                                    mc.dropless);
  }
  MOE_CHECK(!cfg_.train.cuda_graph || dev_ == Device::CUDA, "train.cuda_graph = true needs the GPU, but this run uses ",
            device_note_);
  MOE_CHECK(!cfg_.train.cuda_graph || !fsdp,
            "train.cuda_graph = true with parallel.mode = \"fsdp\": the FSDP baseline runs eagerly (its per-block "
            "gathers are counted on the host); use parallel.mode = \"ddp\" or cuda_graph = false");
  MOE_CHECK(!cfg_.train.cuda_graph || mc.routing != Routing::Random,
            "train.cuda_graph = true with model.routing = \"random\": the routing draw is seeded per step by a launch "
            "argument, which a replayed graph would repeat; use learned or uniform routing, or cuda_graph = false");
  const int64_t rows = cfg_.train.micro_batch_size * cfg_.train.seq_len;
  const int64_t accum = cfg_.accumulation_steps(dp);
  const int64_t L = mc.num_hidden_layers, N = mc.num_experts;
  router_bias_ = state_.reserve("router_bias", DType::F32, {L, N});
  expert_load_ = state_.reserve("expert_load", DType::F32, {L, N});
  step_stats_ = state_.reserve("step_stats", DType::F32, {kNumStepStats});
  tokens_ = state_.reserve("batch.tokens", DType::I32, {accum * rows});
  targets_ = state_.reserve("batch.targets", DType::I32, {accum * rows});
  schedule_ = state_.reserve("optimizer.schedule", DType::F32, {2});
  host_tokens_.resize(static_cast<size_t>(accum * rows));
  host_targets_.resize(static_cast<size_t>(accum * rows));
  host_bias_.assign(static_cast<size_t>(L * N), 0.0f);
  host_load_.assign(static_cast<size_t>(L * N), 0.0f);
  model_ = std::make_unique<Transformer>(mc, cfg_.train.micro_batch_size, cfg_.train.seq_len, acts_, *dispatcher_,
                                         static_cast<int>(cfg_.parallel.lease_slots));
  model_->set_block_hooks(store_->hooks());
  // Fail before any work when the plan cannot fit in this machine's (or this GPU's) memory.
  size_t limit = physical_memory_bytes();
  if (dev_ == Device::CUDA) {
    const DeviceMemory m = device_memory();
    limit = m.free_bytes > kLibraryReserveBytes ? m.free_bytes - kLibraryReserveBytes : 1;
  }
  state_.commit(limit);
  acts_.commit(limit > state_.total_bytes() ? limit - state_.total_bytes() : 1);
  store_->init(cfg_.train.seed);
  if (!opts_.resume.empty()) load_checkpoint(opts_.resume == "latest" ? cfg_.run_dir() : opts_.resume);
}

Trainer::~Trainer() = default;

void Trainer::print_plan() const {
  const double tokens_per_step = static_cast<double>(cfg_.train.global_batch_size * cfg_.train.seq_len);
  std::printf("moetrain: config '%s', %s parameters (%s active per token, capacity ratio %.2f)\n",
              cfg_.name.c_str(), format_count(flops_.total_params).c_str(),
              format_count(flops_.active_params).c_str(), flops_.total_params / flops_.active_params);
  std::printf("  data: %s\n", data_.describe().c_str());
  if (cfg_.parallel.mode == "fsdp")
    std::printf("  parallel: fsdp over %d ranks (every parameter sharded; full weights gathered per block)\n",
                world_.size());
  else
    std::printf("  parallel: %d ranks, ep %d (%s dispatch), expert replicas %d\n", world_.size(),
                mesh_->ep, dispatcher_->name(), mesh_->ep_dp);
  std::printf("  batch: %ld sequences x %ld tokens per step, %ld microbatches of %ld per rank; %s FLOPs per token\n",
              static_cast<long>(cfg_.train.global_batch_size), static_cast<long>(cfg_.train.seq_len),
              static_cast<long>(cfg_.accumulation_steps(world_.size())), static_cast<long>(cfg_.train.micro_batch_size),
              format_count(flops_.flops_per_token).c_str());
  auto b = [](size_t n) { return format_bytes(static_cast<double>(n)); };
  const size_t params = state_.bytes_with_prefix("parameters"), compute = state_.bytes_with_prefix("compute_weights");
  const size_t grads = state_.bytes_with_prefix("gradients"), optim = state_.bytes_with_prefix("optimizer.");
  const size_t other = state_.total_bytes() - params - compute - grads - optim;
  std::printf("  device: %s; MFU against %.4g TFLOP/s (%s)\n", device_note_.c_str(), peak_tflops_, peak_note_.c_str());
  std::printf("  memory plan (%s, %.0f tokens/step): parameters %s (FP32), compute weights %s (BF16), gradients %s, "
              "optimizer %s, other state %s; activations %s (expert buffers %s); total %s\n",
              std::string(device_name(dev_)).c_str(), tokens_per_step, b(params).c_str(), b(compute).c_str(), b(grads).c_str(),
              b(optim).c_str(), b(other).c_str(), b(acts_.total_bytes()).c_str(),
              b(acts_.bytes_with_prefix("dispatch.") + dispatcher_->heap_bytes()).c_str(),
              b(state_.total_bytes() + acts_.total_bytes() + dispatcher_->heap_bytes()).c_str());
  if (dispatcher_->heap_bytes() > 0)
    std::printf("  (expert buffers in the %s dispatcher's symmetric heap: %s per rank, outside the arenas)\n",
                dispatcher_->name(), b(dispatcher_->heap_bytes()).c_str());
  std::fflush(stdout);
}

void Trainer::load_checkpoint(const std::string& path) {
  const auto t0 = Clock::now();
  const size_t rss_before = peak_rss_bytes();
  const std::string dir = resolve_checkpoint(path);
  CheckpointReader ckpt(dir);
  const nlohmann::json& st = ckpt.train_state();
  MOE_CHECK(st.contains("model_config") && st.contains("step"), "checkpoint ", dir,
            ": train_state.json lacks model_config or step");
  const std::string theirs = st["model_config"].get<std::string>(), ours = model_config_toml(cfg_.model);
  MOE_CHECK(theirs == ours, "cannot resume from ", dir, ": the model config differs:", config_diff(ours, theirs));
  // Every rank reads the ranges it holds under the current topology, whatever wrote them.
  store_->load(ckpt);
  if (ckpt.has("router_bias")) {
    ckpt.read("router_bias", DType::F32, 0, static_cast<int64_t>(host_bias_.size()), host_bias_.data());
    copy_to_tensor(state_.get(router_bias_), host_bias_.data());
  }
  start_step_ = st["step"].get<int64_t>();
  skipped_steps_ = st.value("skipped_steps", int64_t{0});
  MOE_CHECK(start_step_ <= cfg_.train.steps, "checkpoint ", dir, " is at step ", start_step_,
            ", past train.steps = ", cfg_.train.steps);
  if (!opts_.quiet && leader())
    std::printf("resumed from %s at step %ld (read in %.2f s; rank 0 peak resident memory %s before, %s after)\n",
                dir.c_str(), static_cast<long>(start_step_), seconds_since(t0),
                format_bytes(static_cast<double>(rss_before)).c_str(),
                format_bytes(static_cast<double>(peak_rss_bytes())).c_str());
}

void Trainer::save_checkpoint_now(int64_t step) {
  // DESIGN.md section 8: rank 0 opens a temporary directory, every rank writes the slices it
  // owns into its own file, rank 0 gathers the chunk records (through small JSON files in the
  // temporary directory: the checkpoint folder must be shared by the ranks anyway), writes the
  // index and renames the directory, which is the commit point.
  const auto t0 = Clock::now();
  const size_t rss_before = peak_rss_bytes();
  const std::string run = cfg_.run_dir();
  std::string tmp = run + "/.tmp-" + checkpoint_dir_name(step);
  if (leader()) tmp = begin_checkpoint(run, step);
  world_.barrier();
  std::vector<CheckpointSlice> slices = store_->checkpoint_slices();
  // GPU state is streamed through host memory one slice at a time: the writer asks for each
  // slice's bytes just before writing it.
  std::vector<const void*> device_data(slices.size(), nullptr);
  if (dev_ == Device::CUDA)
    for (size_t i = 0; i < slices.size(); ++i) std::swap(device_data[i], slices[i].data);
  const int64_t L = cfg_.model.num_hidden_layers, N = cfg_.model.num_experts;
  if (leader()) slices.push_back({"router_bias", DType::F32, {L, N}, 0, L * N, host_bias_.data()});
  device_data.resize(slices.size(), nullptr);
  const std::vector<CheckpointChunk> mine =
      write_rank_file(tmp, world_.rank(), slices, [&](size_t i, void* dst) {
        const CheckpointSlice& s = slices[i];
        const int64_t n = s.end - s.begin;
        copy_from_tensor(dst, Tensor(const_cast<void*>(device_data[i]), s.dtype, {n}, dev_));
      });
  if (!leader()) {  // rank 0 keeps its own records in memory
    std::ofstream out(tmp + "/chunks-" + std::to_string(world_.rank()) + ".json");
    out << chunks_to_json(mine).dump();
    MOE_CHECK(out.good(), "cannot write chunk records into ", tmp);
  }
  world_.barrier();
  std::string dir;
  if (leader()) {
    std::vector<CheckpointChunk> all = mine;
    for (int r = 1; r < world_.size(); ++r) {
      const std::string f = tmp + "/chunks-" + std::to_string(r) + ".json";
      std::ifstream in(f);
      MOE_CHECK(in.good(), "missing chunk records of rank ", r, ": ", f);
      const std::vector<CheckpointChunk> theirs = chunks_from_json(nlohmann::json::parse(in));
      all.insert(all.end(), theirs.begin(), theirs.end());
      in.close();
      fs::remove(f);
    }
    nlohmann::json st;
    st["step"] = step;
    st["skipped_steps"] = skipped_steps_;
    st["data_position"] = {{"step", step},
                           {"note", "training windows are a pure function of (data.seed, step, sequence)"}};
    st["rng"] = {{"train.seed", cfg_.train.seed}, {"data.seed", cfg_.data.seed}};
    st["topology"] = {{"world_size", world_.size()}, {"mode", cfg_.parallel.mode}, {"ep", cfg_.parallel.ep}};
    st["model_config"] = model_config_toml(cfg_.model);
    st["config"] = config_to_toml(cfg_);
    write_checkpoint_index(tmp, step, all, st);
    dir = commit_checkpoint(run, step);
    if (cfg_.train.keep_last > 0) prune_checkpoints(run, static_cast<int>(cfg_.train.keep_last));
    if (!opts_.quiet) {
      uintmax_t bytes = 0;
      for (const auto& e : fs::directory_iterator(dir)) bytes += e.is_regular_file() ? e.file_size() : 0;
      std::printf("saved checkpoint %s (%s in %.2f s; rank 0 peak resident memory %s before, %s after)\n",
                  dir.c_str(), format_bytes(static_cast<double>(bytes)).c_str(), seconds_since(t0),
                  format_bytes(static_cast<double>(rss_before)).c_str(),
                  format_bytes(static_cast<double>(peak_rss_bytes())).c_str());
    }
  }
  world_.barrier();
}

void Trainer::update_router_bias() {
  const double rate = cfg_.model.bias_update_rate;
  if (rate <= 0 || cfg_.model.routing != Routing::Learned) return;
  const int64_t N = cfg_.model.num_experts;
  for (int64_t l = 0; l < cfg_.model.num_hidden_layers; ++l) {
    if (!cfg_.model.is_moe_layer(l)) continue;
    float* b = host_bias_.data() + l * N;
    const float* c = host_load_.data() + l * N;
    double mean = 0;
    for (int64_t e = 0; e < N; ++e) mean += c[e];
    mean /= static_cast<double>(N);
    // Sign update: under-loaded experts become more attractive, over-loaded ones less.
    for (int64_t e = 0; e < N; ++e)
      b[e] += static_cast<float>(rate * (c[e] < mean ? 1.0 : c[e] > mean ? -1.0 : 0.0));
  }
  copy_to_tensor(state_.get(router_bias_), host_bias_.data());  // between steps, read by the next one
}

void Trainer::upload_batch(int64_t step) {
  const TrainConfig& t = cfg_.train;
  const int64_t dp = world_.size(), rank = world_.rank();
  const int64_t B = t.micro_batch_size, T = t.seq_len, accum = cfg_.accumulation_steps(dp);
  for (int64_t micro = 0; micro < accum; ++micro) {
    // Global sequences of this microbatch: the same global batch in the same order on any topology.
    data_.train_batch(step, (micro * dp + rank) * B, B, T, host_tokens_.data() + micro * B * T,
                      host_targets_.data() + micro * B * T);
  }
  copy_to_tensor(state_.get(tokens_), host_tokens_.data());
  copy_to_tensor(state_.get(targets_), host_targets_.data());
}

void Trainer::queue_gradients(int64_t step) {
  const TrainConfig& t = cfg_.train;
  const int64_t dp = world_.size(), rank = world_.rank();
  const int64_t rows = t.micro_batch_size * t.seq_len, accum = cfg_.accumulation_steps(dp);
  const int64_t moe_layers = cfg_.model.num_hidden_layers - cfg_.model.first_k_dense_replace;
  // Every rank scales by the global batch, so the reduced gradient is that of the global mean loss.
  StepScales scales;
  scales.lm_grad_scale = 1.0f / static_cast<float>(t.global_batch_size * t.seq_len);
  scales.aux_grad_scale = moe_layers > 0 ? 1.0f / static_cast<float>(accum * dp * moe_layers) : 0.0f;
  // On the GPU the first microbatch writes the expert gradients instead of adding them (the CPU
  // keeps its bit-exact accumulation order: 0 + (-0) is +0), so only the dense ones need zeros.
  // One flag for both decisions: a store that skips the zeros relies on that write.
  const bool first_microbatch_writes_experts = dev_ == Device::CUDA;
  store_->zero_grads(first_microbatch_writes_experts);
  Tensor load = state_.get(expert_load_), stats = state_.get(step_stats_);
  fill_zero(load);
  fill_zero(stats);
  RoutingState rs{state_.get(router_bias_), load};
  const Tensor tokens = state_.get(tokens_), targets = state_.get(targets_);
  for (int64_t micro = 0; micro < accum; ++micro) {
    scales.gradients_zeroed = micro == 0 && first_microbatch_writes_experts;
    model_->forward_backward(store_->weights(), store_->grads(), tokens.rows(micro * rows, (micro + 1) * rows),
                             targets.rows(micro * rows, (micro + 1) * rows), scales,
                             routing_seed(t.seed, step, micro * dp + rank), rs);
    model_->add_stats(stats);
  }
}

// Test hook: make one rank fail in the middle of a step (the job must end, not hang).
void Trainer::fail_for_test(int64_t step) const {
  if (const char* r = std::getenv("MOE_TEST_FAIL_ON_RANK"); r && std::atoi(r) == world_.rank() && step == 1)
    MOE_FAIL("test hook MOE_TEST_FAIL_ON_RANK: rank ", world_.rank(), " fails in step ", step + 1);
}

void Trainer::accumulate_gradients(int64_t step) {
  fail_for_test(step);
  upload_batch(step);
  queue_gradients(step);
}

void Trainer::queue_step(int64_t step, const AdamWConfig& oc, double* optimizer_s) {
  queue_gradients(step);
  const auto t_opt = Clock::now();
  // On the GPU, AdamW reads lr and step from memory so that a replayed graph sees this step's values.
  store_->enqueue_step(oc, static_cast<float>(cfg_.train.grad_clip), step + 1,
                       dev_ == Device::CUDA ? state_.get(schedule_) : Tensor());
  // GPU work is asynchronous: the host time of queueing it says nothing (bench splits the GPU step by kernel).
  if (optimizer_s && dev_ == Device::CPU) *optimizer_s = seconds_since(t_opt);
}

void Trainer::all_reduce_host(std::vector<float>& v) {
  const Tensor stats = state_.get(step_stats_);
  MOE_CHECK(static_cast<int64_t>(v.size()) <= stats.numel(), "all_reduce_host: ", v.size(), " values, room for ",
            stats.numel());
  const Tensor part = stats.rows(0, static_cast<int64_t>(v.size()));
  copy_to_tensor(part, v.data());
  world_.all_reduce(part, ReduceOp::Sum);
  copy_from_tensor(v.data(), part);
}

StepRecord Trainer::train_step(int64_t step) {
  const TrainConfig& t = cfg_.train;
  const int64_t dp = world_.size(), T = t.seq_len, accum = cfg_.accumulation_steps(dp);
  const auto t0 = Clock::now();
  const double comm_before = world_.seconds();
  const int64_t bytes_before = dispatch_bytes_moved(*dispatcher_);
  StepRecord r;
  r.step = step + 1;
  r.lr = lr_at(step, t.steps, t.lr, t.warmup_steps, t.min_lr_ratio);
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
    copy_to_tensor(state_.get(schedule_), schedule);
  }
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
  copy_from_tensor(st.data(), state_.get(step_stats_).rows(0, kNumMicrobatchStats));
  const int64_t moe_layers = cfg_.model.num_hidden_layers - cfg_.model.first_k_dense_replace;
  st[kRoutes] = static_cast<float>(accum * t.micro_batch_size * T * cfg_.model.num_experts_per_tok * moe_layers);
  st[kCapacity] = static_cast<float>(accum * model_->expert_rows() * moe_layers);
  st[kBytesMoved] = static_cast<float>(dispatch_bytes_moved(*dispatcher_) - bytes_before);
  const ParamStore::StepResult opt = store_->last_step();
  all_reduce_host(st);
  const Tensor load = state_.get(expert_load_);
  world_.all_reduce(load, ReduceOp::Sum);  // every rank sees the global expert load (bias update, metrics)
  copy_from_tensor(host_load_.data(), load);
  r.comm_time_s = world_.seconds() - comm_before;
  r.skipped = opt.skipped;
  if (opt.skipped)
    ++skipped_steps_;
  else
    update_router_bias();
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
  r.mfu = flops_.flops_per_token * r.tokens_per_s / (peak_tflops_ * 1e12 * static_cast<double>(dp));
  // Routes sent minus rows kept, summed over the world: the routes dropped by capacity.
  r.dropped_fraction = st[kRoutes] > 0 ? (st[kRoutes] - st[kReceived]) / st[kRoutes] : 0.0;
  r.receive_utilization = st[kCapacity] > 0 ? st[kReceived] / st[kCapacity] : 0.0;
  r.dispatch_bytes = st[kBytesMoved];
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

double Trainer::evaluate(int64_t batches) {
  const int64_t dp = world_.size(), rank = world_.rank();
  const int64_t B = cfg_.train.micro_batch_size, T = cfg_.train.seq_len;
  const int64_t n = std::min(batches, data_.eval_num_sequences(T) / (B * dp));  // microbatches per rank
  if (n <= 0) return std::nan("");
  const Tensor tokens = state_.get(tokens_).rows(0, B * T), targets = state_.get(targets_).rows(0, B * T);
  RoutingState rs{state_.get(router_bias_), Tensor()};
  double local = 0;  // summed in double; one rounding to FP32 before the all-reduce
  for (int64_t i = 0; i < n; ++i) {
    data_.eval_batch((i * dp + rank) * B, B, T, host_tokens_.data(), host_targets_.data());
    copy_to_tensor(tokens, host_tokens_.data());
    copy_to_tensor(targets, host_targets_.data());
    model_->forward_loss(store_->weights(), tokens, targets, routing_seed(cfg_.train.seed, -1, i * dp + rank), rs);
    local += model_->losses().lm_loss_sum;
  }
  std::vector<float> sum{static_cast<float>(local)};
  all_reduce_host(sum);
  return sum[0] / static_cast<double>(n * dp * B * T);
}

double Trainer::microbatch_loss(int64_t step) {
  const int64_t rows = cfg_.train.micro_batch_size * cfg_.train.seq_len;
  upload_batch(step);
  const RoutingState rs{state_.get(router_bias_), Tensor()};
  model_->forward_loss(store_->weights(), state_.get(tokens_).rows(0, rows), state_.get(targets_).rows(0, rows),
                       routing_seed(cfg_.train.seed, step, world_.rank()), rs);
  std::vector<float> sum{static_cast<float>(model_->losses().lm_loss_sum)};
  all_reduce_host(sum);
  return sum[0] / static_cast<double>(rows * world_.size());
}

EvalReport Trainer::evaluate_data(const std::string& path, int64_t max_tokens, const std::string& logits_npy) {
  std::vector<std::string> paths;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path))
      if (e.path().extension() == ".npy") paths.push_back(e.path().string());
    std::sort(paths.begin(), paths.end());
    MOE_CHECK(!paths.empty(), "eval: no .npy files in ", path);
  } else {
    MOE_CHECK(fs::exists(path), "eval: data '", path, "' does not exist");
    paths.push_back(path);
  }
  const int64_t B = cfg_.train.micro_batch_size, T = cfg_.train.seq_len, V = cfg_.model.vocab_size;
  std::vector<NpyTokens> files;
  struct Window {
    size_t file;
    int64_t start;
  };
  std::vector<Window> windows;
  int64_t predicted = 0;
  for (const auto& p : paths) {
    files.push_back(NpyTokens::open(p));
    const NpyTokens& f = files.back();
    for (int64_t i = 0; i < f.size(); ++i)
      MOE_CHECK(f.at(i) < static_cast<uint32_t>(V), p, ": token ", f.at(i), " at index ", i, " is >= model.vocab_size = ", V);
    for (int64_t start = 0; start + T + 1 <= f.size(); start += T) {
      if (max_tokens > 0 && predicted >= max_tokens) break;
      windows.push_back({files.size() - 1, start});
      predicted += T;
    }
  }
  const int64_t dp = world_.size(), rank = world_.rank();
  const int64_t per_rank = static_cast<int64_t>(windows.size()) / (B * dp);  // microbatches per rank
  MOE_CHECK(per_rank > 0, "eval: ", windows.size(), " windows of ", T + 1, " tokens in ", path, " do not fill one microbatch of ",
            B, " sequences per rank (", dp, " ranks)");
  const Tensor tokens = state_.get(tokens_).rows(0, B * T), targets = state_.get(targets_).rows(0, B * T);
  RoutingState rs{state_.get(router_bias_), Tensor()};
  double local = 0;  // summed in double; one rounding to FP32 before the all-reduce
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < per_rank; ++i) {
    for (int64_t j = 0; j < B; ++j) {
      const Window& w = windows[static_cast<size_t>((i * dp + rank) * B + j)];
      const NpyTokens& f = files[w.file];
      for (int64_t t = 0; t < T; ++t) {
        host_tokens_[static_cast<size_t>(j * T + t)] = static_cast<int32_t>(f.at(w.start + t));
        host_targets_[static_cast<size_t>(j * T + t)] = static_cast<int32_t>(f.at(w.start + t + 1));
      }
    }
    copy_to_tensor(tokens, host_tokens_.data());
    copy_to_tensor(targets, host_targets_.data());
    const uint64_t seed = routing_seed(cfg_.train.seed, -1, i * dp + rank);
    model_->forward_loss(store_->weights(), tokens, targets, seed, rs);
    local += model_->losses().lm_loss_sum;
    if (i == 0 && !logits_npy.empty()) {
      // Every rank runs the forward (expert parallelism makes it collective); rank 0 writes.
      std::vector<float> logits(static_cast<size_t>(B * T * V));
      const DeviceAllocation buf(logits.size() * sizeof(float), dev_);
      const Tensor out(buf.data(), DType::F32, {B * T, V}, dev_);
      model_->forward_logits(store_->weights(), tokens, out, seed, rs);
      copy_from_tensor(logits.data(), out);
      if (leader()) write_npy_f32(logits_npy, logits, {B * T, V});
    }
  }
  std::vector<float> sum{static_cast<float>(local)};
  all_reduce_host(sum);
  EvalReport r;
  r.tokens = per_rank * dp * B * T;
  r.mean_loss = sum[0] / static_cast<double>(r.tokens);
  r.tokens_per_s = static_cast<double>(r.tokens) / seconds_since(t0);
  r.windows_skipped = static_cast<int64_t>(windows.size()) - per_rank * dp * B;
  return r;
}

TrainSummary Trainer::run() {
  const TrainConfig& t = cfg_.train;
  TrainSummary summary;
  summary.first_step = start_step_;
  summary.attainable_loss = data_.attainable_loss();
  std::unique_ptr<MetricsLog> metrics;
  const bool talk = leader() && !opts_.quiet;
  if (!opts_.bench && leader()) {
    std::error_code ec;
    fs::create_directories(cfg_.run_dir(), ec);
    MOE_CHECK(!ec, "cannot create run directory '", cfg_.run_dir(), "' (run.dir): ", ec.message());
    metrics = std::make_unique<MetricsLog>(cfg_.run_dir() + "/metrics.jsonl");
  }
  if (talk) print_plan();
  const double dp = static_cast<double>(world_.size());
  const double ideal_step_s = flops_.flops_per_token * static_cast<double>(t.global_batch_size * t.seq_len) /
                              (peak_tflops_ * 1e12 * dp);
  double comm_s = 0, opt_s = 0;
  const double tokens_per_step = static_cast<double>(t.global_batch_size * t.seq_len);
  const auto run_start = Clock::now();
  double timed_s = 0;
  int64_t timed_steps = 0;
  int64_t last_saved = start_step_;
  const bool profile = dev_ == Device::CUDA && opts_.profiler != nullptr && opts_.profiler->available() &&
                       t.steps - start_step_ > 1;
  for (int64_t step = start_step_; step < t.steps; ++step) {
    if (profile && step == start_step_ + 1) opts_.profiler->start();  // the first step builds plans: not timed
    StepRecord r = train_step(step);
    summary.steps.push_back(r);
    if (step > start_step_ || t.steps - start_step_ == 1) {
      timed_s += r.step_time_s, comm_s += r.comm_time_s, opt_s += r.optimizer_time_s;
      ++timed_steps;
    }
    const bool last = r.step == t.steps;
    const bool log = r.step % t.log_every == 0 || last || step == start_step_;
    std::optional<double> eval;
    if (!opts_.bench && t.eval_every > 0 && t.eval_batches > 0 && (r.step % t.eval_every == 0 || last)) {
      const double e = evaluate(t.eval_batches);
      if (std::isfinite(e)) eval = e;
      if (last) summary.eval_loss = eval;  // the final evaluation; not repeated below
    }
    if (log || eval) {
      const double elapsed = seconds_since(run_start);
      const double eta = elapsed / static_cast<double>(step - start_step_ + 1) * static_cast<double>(t.steps - r.step);
      if (talk) {
        std::printf("step %5ld/%ld | loss %.4f (lm %.4f lb %.3f z %.3f) | gnorm %.3f | lr %.2e | %s tok/s | MFU %.2f%% | %.0f ms/step | ETA %s%s\n",
                    static_cast<long>(r.step), static_cast<long>(t.steps), r.loss, r.lm_loss, r.lb_loss, r.z_loss,
                    r.grad_norm, r.lr, format_count(r.tokens_per_s).c_str(), 100 * r.mfu,
                    1000 * r.step_time_s, format_duration(eta).c_str(),
                    r.skipped ? " | SKIPPED (non-finite gradient)" : "");
        if (eval) std::printf("  eval loss %.4f\n", *eval);
        std::fflush(stdout);
      }
      if (metrics) {
        nlohmann::json j = {{"step", r.step},
                            {"loss", r.loss},
                            {"lm_loss", r.lm_loss},
                            {"lb_loss", r.lb_loss},
                            {"z_loss", r.z_loss},
                            {"grad_norm", r.grad_norm},
                            {"lr", r.lr},
                            {"tokens_per_s", r.tokens_per_s},
                            {"mfu", r.mfu},
                            {"step_time_s", r.step_time_s},
                            {"ideal_time_s", ideal_step_s},
                            {"comm_time_s", r.comm_time_s},
                            {"optimizer_time_s", r.optimizer_time_s},
                            {"world_size", world_.size()},
                            {"dropped_fraction", r.dropped_fraction},
                            {"receive_buffer_utilization", r.receive_utilization},
                            {"dispatch_combine_bytes", r.dispatch_bytes},
                            {"expert_load_max_over_mean", r.expert_load_max_over_mean},
                            {"expert_load_max_over_mean_per_layer", r.expert_load_per_layer},
                            {"skipped", r.skipped},
                            {"skipped_steps", skipped_steps_},
                            {"tokens_seen", static_cast<double>(r.step) * tokens_per_step},
                            {"arena_bytes", state_.total_bytes() + acts_.total_bytes()},
                            {"peak_rss_bytes", peak_rss_bytes()}};
        if (eval) j["eval_loss"] = *eval;
        metrics->write(j);
      }
    }
    if (!opts_.bench && t.save_every > 0 && r.step % t.save_every == 0) {
      save_checkpoint_now(r.step);
      last_saved = r.step;
    }
  }
  summary.last_step = t.steps;
  if (profile && opts_.profiler->recording()) opts_.profiler->stop();
  if (!opts_.bench && cfg_.run.save_final && last_saved != t.steps && t.steps > start_step_)
    save_checkpoint_now(t.steps);
  if (!opts_.bench && t.eval_batches > 0 && !summary.eval_loss && !(t.eval_every > 0 && t.steps > start_step_)) {
    const double e = evaluate(t.eval_batches);
    if (std::isfinite(e)) summary.eval_loss = e;
  }
  summary.skipped_steps = skipped_steps_;
  if (timed_steps > 0) {
    summary.mean_step_time_s = timed_s / static_cast<double>(timed_steps);
    summary.mean_tokens_per_s = tokens_per_step / summary.mean_step_time_s;
    summary.mean_mfu = ideal_step_s / summary.mean_step_time_s;  // per device
    summary.mean_comm_time_s = comm_s / static_cast<double>(timed_steps);
    summary.mean_optimizer_time_s = opt_s / static_cast<double>(timed_steps);
  }
  summary.arena_bytes = state_.total_bytes() + acts_.total_bytes();
  summary.peak_rss_bytes = peak_rss_bytes();
  summary.device = dev_;
  summary.device_peak_bytes = device_peak_bytes_;
  summary.graph_nodes = graph_ ? graph_->nodes() : 0;
  return summary;
}

}  // namespace moe

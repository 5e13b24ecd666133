#include "moe/train/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "moe/comm/plan_communicator.h"
#include "moe/train/run_model.h"

namespace moe {

namespace {

std::string gib(size_t bytes) { return format_bytes(static_cast<double>(bytes)); }

std::string quoted(const char* value) {
  std::string s = "\"";
  s += value;
  s += '"';
  return s;
}

// One planned variant of the config: the changes applied to a copy, validated as a run would be.
struct Variant {
  Config cfg;
  std::vector<std::pair<std::string, std::string>> changes;
  int cost = 0;
};

// Expected step-time cost of each lever, for ordering only (bench/RESULTS.md has the measured
// costs on the H200: BF16 moments cost nothing, recompute = experts/attention ~7-11%, block ~24%;
// a larger EP moves more rows between ranks; a smaller microbatch runs smaller GEMMs).
int recompute_cost(Recompute r) {
  switch (r) {
    case Recompute::None: return 0;
    case Recompute::Experts: return 2;
    case Recompute::Attention: return 2;
    case Recompute::Block: return 5;
  }
  return 0;
}

// "ddp, pp 2 (1f1b, layers per chunk [3, 1]), ep 2 (rowwise, bf16 payload)": the layout a plan is for.
std::string topology_text(const Config& cfg, Device device) {
  const ParallelConfig& par = cfg.parallel;
  std::ostringstream os;
  os << par.mode << ", pp " << par.pp;
  if (par.pp > 1 || !par.pp_layers.empty()) {
    os << " (" << par.pp_schedule;
    if (par.pp_virtual > 1) os << ", " << par.pp_virtual << " chunks per rank";
    if (par.pp_layers.empty()) {
      os << ", layers balanced by cost";
    } else {
      os << ", layers per chunk [";
      for (size_t i = 0; i < par.pp_layers.size(); ++i) os << (i ? ", " : "") << par.pp_layers[i];
      os << "]";
    }
    os << ")";
  }
  // EP = 1 runs the local dispatcher on CPU ranks and the GPU rowwise one (a group of one, as
  // plan_rank builds it) on GPUs; FSDP has no expert parallelism.
  if (par.mode == "ddp")
    os << ", ep " << par.ep << " (" << (par.ep == 1 && device != Device::CUDA ? "local" : cfg.ep.backend.c_str())
       << ", "
       << to_string(cfg.ep.payload) << " payload)";
  return os.str();
}

}  // namespace

MemoryRoles memory_roles(const Arena& state, const Arena& acts, const RunModel& run) {
  const TokenDispatcher& dispatcher = *run.dispatcher;
  MemoryRoles m;
  const size_t fsdp_w = state.bytes_with_prefix("fsdp.weight_shards");
  const size_t fsdp_w16 = state.bytes_with_prefix("fsdp.weight_shards_bf16");
  m.parameters = state.bytes_with_prefix("parameters") + fsdp_w - fsdp_w16;
  m.compute_weights = state.bytes_with_prefix("compute_weights") + fsdp_w16;
  m.gradients = state.bytes_with_prefix("gradients") + state.bytes_with_prefix("fsdp.grad_shards");
  m.optimizer = state.bytes_with_prefix("optimizer.") + state.bytes_with_prefix("fsdp.exp_avg");
  m.other_state = state.total_bytes() - m.parameters - m.compute_weights - m.gradients - m.optimizer;
  // On the CPU the trainer's host copy of the step's batch (Trainer::host_tokens_ and host_targets_,
  // as large as batch.tokens and batch.targets) takes the same memory the plan is checked against.
  if (state.device() == Device::CPU) m.other_state += state.bytes_with_prefix("batch.");
  m.activations = acts.total_bytes();
  m.heap = dispatcher.heap_bytes();
  m.expert_buffers = acts.bytes_with_prefix("dispatch.") + m.heap;
  m.library_workspace = static_cast<size_t>(run.model->library_workspace_bytes());
  return m;
}

MemoryRoles plan_rank(const Config& cfg, int world_size, int rank, Device device, StoreUse use) {
  cfg.validate(cfg.parallel.dp(world_size));
  PlanCommunicator world(rank, world_size);
  Arena state("model state", device), acts("activations", device);
  const auto run =
      build_run_model(cfg, world, device, /*device_collectives=*/device == Device::CUDA, state, acts, use);
  return memory_roles(state, acts, *run);
}

MemoryRoles plan_largest_rank(const Config& cfg, int world_size, Device device, StoreUse use) {
  MemoryRoles largest;
  // Pipeline stages differ in their layers and in the microbatches they keep in flight (1F1B: the
  // first stage the most, a middle stage may hold the most layers): every stage is planned. Within
  // a stage, shards differ by at most one remainder, which its first or its last rank holds.
  const int pp = static_cast<int>(std::max<int64_t>(1, cfg.parallel.pp));
  if (world_size % pp != 0) return plan_rank(cfg, world_size, 0, device, use);  // throws what the run would
  const int per_stage = world_size / pp;
  for (int stage = 0; stage < pp; ++stage)
    for (int rank : {stage * per_stage, (stage + 1) * per_stage - 1}) {
      const MemoryRoles m = plan_rank(cfg, world_size, rank, device, use);
      if (m.total() > largest.total()) largest = m;
    }
  return largest;
}

std::string FitOption::describe() const {
  std::string s;
  for (const auto& [key, value] : changes) {
    if (!s.empty()) s += " + ";
    s.append(key).append(" = ").append(value);
  }
  return s;
}

std::string FitOption::set_flags() const {
  std::string s;
  for (const auto& [key, value] : changes) {
    std::string v = value;
    v.erase(std::remove(v.begin(), v.end(), '"'), v.end());
    if (!s.empty()) s += ' ';
    s.append("--set ").append(key).append("=").append(v);
  }
  return s;
}

std::vector<FitOption> fit_options(const Config& cfg, int world_size, Device device, size_t usable, StoreUse use) {
  // Each lever's settings (the current one first), combined below. An evaluation keeps no moments.
  std::vector<Variant> moments{{cfg, {}, 0}};
  if (cfg.optim.moment_dtype == DType::F32 && use == StoreUse::Training) {
    Variant v{cfg, {{"optim.moment_dtype", quoted("bf16")}}, 1};
    v.cfg.optim.moment_dtype = DType::BF16;
    moments.push_back(v);
  }
  // Recompute modes that keep less than the current one (block keeps least; experts and attention
  // drop different buffers); experts only where there are MoE layers.
  const bool has_moe = cfg.model.first_k_dense_replace < cfg.model.num_hidden_layers;
  std::vector<Variant> recomputes{{cfg, {}, 0}};
  for (Recompute r : {Recompute::Experts, Recompute::Attention, Recompute::Block}) {
    if (cfg.train.recompute == Recompute::Block) break;
    if (r == cfg.train.recompute || (cfg.train.recompute != Recompute::None && r != Recompute::Block)) continue;
    if (r == Recompute::Experts && !has_moe) continue;
    Variant v{cfg, {{"train.recompute", quoted(to_string(r))}}, recompute_cost(r)};
    v.cfg.train.recompute = r;
    recomputes.push_back(v);
  }
  // Cost of a factor f: 3 per doubling, rounded up.
  const auto factor_cost = [](int64_t f) { return 3 * static_cast<int>(std::ceil(std::log2(static_cast<double>(f)))); };
  // Every larger EP that divides the ranks and the experts (DDP with MoE layers only).
  std::vector<Variant> eps{{cfg, {}, 0}};
  if (cfg.parallel.mode == "ddp" && has_moe)
    for (int64_t ep = cfg.parallel.ep * 2; ep <= world_size; ep += cfg.parallel.ep) {
      if (world_size % ep != 0 || cfg.model.num_experts % ep != 0) continue;
      Variant v{cfg, {{"parallel.ep", std::to_string(ep)}}, factor_cost(ep / cfg.parallel.ep)};
      v.cfg.parallel.ep = ep;
      eps.push_back(v);
    }
  // Smaller microbatches that divide the current one (the global batch stays divisible): all of
  // them when there are a few, else at each halving the largest divisor at most that size, so a
  // microbatch with many divisors offers a few sizes across the whole range, not every divisor.
  const int64_t current = cfg.train.micro_batch_size;
  std::vector<int64_t> divisors;  // of the current size, by trial division up to its square root
  for (int64_t d = 1; d * d <= current; ++d)
    if (current % d == 0) divisors.insert(divisors.end(), {d, current / d});
  std::sort(divisors.begin(), divisors.end());
  divisors.erase(std::unique(divisors.begin(), divisors.end()), divisors.end());
  divisors.pop_back();  // the current size itself
  std::vector<int64_t> sizes;  // largest first
  if (divisors.size() <= 8) {
    sizes.assign(divisors.rbegin(), divisors.rend());
  } else {
    for (int64_t cap = current / 2; cap >= 1; cap /= 2) {
      const int64_t mb = *(std::upper_bound(divisors.begin(), divisors.end(), cap) - 1);  // divisors[0] = 1 <= cap
      if (sizes.empty() || sizes.back() != mb) sizes.push_back(mb);
    }
  }
  std::vector<Variant> micro{{cfg, {}, 0}};
  for (const int64_t mb : sizes) {
    Variant v{cfg, {{"train.micro_batch_size", std::to_string(mb)}}, factor_cost(current / mb)};
    v.cfg.train.micro_batch_size = mb;
    micro.push_back(v);
  }

  std::vector<FitOption> singles, all;
  for (const Variant& a : moments)
    for (const Variant& b : recomputes)
      for (const Variant& c : eps)
        for (const Variant& d : micro) {
          FitOption o;
          Config x = cfg;
          x.optim.moment_dtype = a.cfg.optim.moment_dtype;
          x.train.recompute = b.cfg.train.recompute;
          x.parallel.ep = c.cfg.parallel.ep;
          x.train.micro_batch_size = d.cfg.train.micro_batch_size;
          for (const Variant* v : {&a, &b, &c, &d}) o.changes.insert(o.changes.end(), v->changes.begin(), v->changes.end());
          if (o.changes.empty()) continue;
          o.cost = a.cost + b.cost + c.cost + d.cost;
          try {
            o.plan = plan_largest_rank(x, world_size, device, use);
          } catch (const Error&) {
            continue;  // a combination the run would refuse (e.g. an EP the dispatcher cannot run)
          }
          o.fits = o.plan.total() <= usable;
          (o.changes.size() == 1 ? singles : all).push_back(o);
        }
  // The cheapest option that fits (then the smallest), if no single lever does it.
  const auto better = [](const FitOption& p, const FitOption& q) {
    return p.cost != q.cost ? p.cost < q.cost : p.plan.total() < q.plan.total();
  };
  // A smaller microbatch than the largest one that fits only costs more: not offered.
  const auto micro_only = [](const FitOption& o) { return o.changes[0].first == "train.micro_batch_size"; };
  int64_t largest_fitting_micro = 0;
  for (const FitOption& o : singles)
    if (micro_only(o) && o.fits) largest_fitting_micro = std::max<int64_t>(largest_fitting_micro, std::stoll(o.changes[0].second));
  std::erase_if(singles, [&](const FitOption& o) {
    return micro_only(o) && std::stoll(o.changes[0].second) < largest_fitting_micro;
  });
  std::stable_sort(singles.begin(), singles.end(), better);
  const bool single_fits = std::any_of(singles.begin(), singles.end(), [](const FitOption& o) { return o.fits; });
  if (!single_fits) {
    std::vector<FitOption> fitting;
    for (const FitOption& o : all)
      if (o.fits) fitting.push_back(o);
    if (!fitting.empty()) singles.push_back(*std::min_element(fitting.begin(), fitting.end(), better));
  }
  return singles;
}

std::string does_not_fit_message(const Config& cfg, const MemoryRoles& plan, int world_size, Device device,
                                 size_t usable, StoreUse use) {
  std::ostringstream os;
  const size_t weights = plan.parameters + plan.compute_weights + plan.gradients + plan.optimizer;
  os << (use == StoreUse::Training ? "the run" : "the evaluation") << " needs " << gib(plan.total())
     << " per rank on the " << (device == Device::CUDA ? "GPU" : "CPU") << " but " << gib(usable)
     << " can be planned: ";
  if (use == StoreUse::Training)
    os << "parameters + gradients + optimizer take " << gib(weights) << " (parameters "
       << gib(plan.parameters + plan.compute_weights) << ", gradients " << gib(plan.gradients) << ", optimizer "
       << gib(plan.optimizer) << ")";
  else
    os << "the weights take " << gib(weights) << " (no gradients or optimizer state are kept for an evaluation)";
  os << ", other state " << gib(plan.other_state);
  // The step's tokens and targets (I32, every microbatch of the rank's share of the global batch)
  // are other state: named when they are what a large train.global_batch_size made large.
  // On the CPU twice: the arena's copy and the trainer's host copy (memory_roles).
  const int64_t dp = cfg.parallel.dp(world_size);
  const size_t copies = device == Device::CPU ? 2 : 1;
  const size_t batch = copies * 2 * sizeof(int32_t) * static_cast<size_t>(cfg.accumulation_steps(dp)) *
                       static_cast<size_t>(cfg.train.micro_batch_size * cfg.train.seq_len);
  const bool batch_matters = batch >= plan.total() / 10;
  if (batch_matters)
    os << " (of it the step's tokens and targets" << (copies == 2 ? ", two copies, " : " ") << gib(batch)
       << ": train.global_batch_size "
       << cfg.train.global_batch_size << " x train.seq_len " << cfg.train.seq_len << " over " << dp
       << (dp == 1 ? " data rank)" : " data ranks)");
  os << ", activations " << gib(plan.activations) << " (train.recompute = \"" << to_string(cfg.train.recompute)
     << "\")";
  if (plan.heap > 0) os << ", the expert heap " << gib(plan.heap);
  if (plan.library_workspace > 0)
    os << ", cuDNN's deterministic attention backward " << gib(plan.library_workspace)
       << " (train.deterministic = false frees it)";
  const std::vector<FitOption> options = fit_options(cfg, world_size, device, usable, use);
  for (const FitOption& o : options) {
    os << "\n  " << o.describe() << ": ";
    if (o.changes.size() == 1 && o.changes[0].first == "optim.moment_dtype")
      os << "saves " << gib(plan.optimizer - o.plan.optimizer) << "; ";
    else if (o.changes.size() == 1 && o.changes[0].first == "train.recompute")
      os << "needs " << gib(o.plan.activations) << " of activations; ";
    os << "total " << gib(o.plan.total()) << (o.fits ? " (fits)" : " (does not fit)");
  }
  const FitOption* fit = nullptr;  // the cheapest that fits
  for (const FitOption& o : options)
    if (o.fits && (!fit || o.cost < fit->cost)) fit = &o;
  if (!fit)
    os << "\nnone of these fits at " << world_size << (world_size == 1 ? " rank" : " ranks") << ": use more ranks"
       << (cfg.parallel.mode == "fsdp" ? "" : " (with a larger parallel.ep, or parallel.mode = \"fsdp\")")
       << (batch_matters ? ", a smaller train.global_batch_size" : "")
       << ", a shorter train.seq_len or a smaller model; `moetrain plan "
       << (use == StoreUse::Evaluation ? "--eval --config RUN_DIR/config.toml " : "") << "--gpus N` plans other sizes";
  else
    os << "\ncheapest that fits: " << fit->set_flags();
  return os.str();
}

std::string plan_report(const Config& cfg, int world_size, Device device, size_t memory_per_rank, StoreUse use) {
  const size_t reserve = device == Device::CUDA ? kLibraryReserveBytes : 0;
  const size_t usable = memory_per_rank > reserve ? memory_per_rank - reserve : 0;
  std::vector<MemoryRoles> ranks;
  for (int r = 0; r < world_size; ++r) ranks.push_back(plan_rank(cfg, world_size, r, device, use));
  std::ostringstream os;
  os << (use == StoreUse::Evaluation ? "evaluation plan of '" : "plan of '") << cfg.name << "' on " << world_size
     << " " << (device == Device::CUDA ? "GPU" : "CPU rank") << (world_size == 1 ? "" : "s") << " ("
     << topology_text(cfg, device);
  os << "; " << cfg.train.micro_batch_size << " x " << cfg.train.seq_len << " tokens per microbatch; recompute "
     << to_string(cfg.train.recompute) << "; ";
  if (use == StoreUse::Evaluation)
    os << "the weights only: no gradients or optimizer state";
  else
    os << "AdamW moments " << dtype_name(cfg.optim.moment_dtype) << ", " << 2 * dtype_size(cfg.optim.moment_dtype)
       << " bytes per parameter";
  os << "; precision " << to_string(cfg.train.precision) << ")\n";
  os << "memory per rank: " << gib(memory_per_rank);
  if (reserve > 0) os << ", of which " << gib(reserve) << " stay for cuBLASLt/cuDNN/NCCL workspaces";
  os << "; " << gib(usable) << " to plan\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-12s %11s %11s %11s %11s %11s %12s %11s %11s  %s\n", "ranks", "parameters",
                "compute wts", "gradients", "optimizer", "other", "activations", "expert heap", "total", "fits");
  os << line;
  bool all_fit = true;
  for (int begin = 0; begin < world_size;) {
    int end = begin + 1;
    while (end < world_size && ranks[static_cast<size_t>(end)].total() == ranks[static_cast<size_t>(begin)].total() &&
           ranks[static_cast<size_t>(end)].activations == ranks[static_cast<size_t>(begin)].activations)
      ++end;
    const MemoryRoles& m = ranks[static_cast<size_t>(begin)];
    const std::string who = end - begin == 1 ? std::to_string(begin)
                                             : std::to_string(begin) + "-" + std::to_string(end - 1);
    const bool fits = m.total() <= usable;
    all_fit = all_fit && fits;
    std::snprintf(line, sizeof line, "%-12s %11s %11s %11s %11s %11s %12s %11s %11s  %s\n", who.c_str(),
                  gib(m.parameters).c_str(), gib(m.compute_weights).c_str(), gib(m.gradients).c_str(),
                  gib(m.optimizer).c_str(), gib(m.other_state).c_str(), gib(m.activations).c_str(),
                  gib(m.heap).c_str(), gib(m.total()).c_str(), fits ? "yes" : "NO");
    os << line;
    begin = end;
  }
  const MemoryRoles& largest =
      *std::max_element(ranks.begin(), ranks.end(), [](const MemoryRoles& a, const MemoryRoles& b) {
        return a.total() < b.total();
      });
  if (largest.library_workspace > 0)
    os << "each total counts " << gib(largest.library_workspace)
       << " for cuDNN's deterministic attention backward (train.deterministic), outside the arenas\n";
  if (all_fit) {
    os << "fits: the largest rank plans " << gib(largest.total()) << " of " << gib(usable) << " ("
       << gib(usable - largest.total()) << " left)\n";
    return os.str();
  }
  os << "does not fit: " << does_not_fit_message(cfg, largest, world_size, device, usable, use) << "\n";
  return os.str();
}

}  // namespace moe

#include "moe/perf/topology_search.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "moe/core/arena.h"
#include "moe/core/error.h"
#include "moe/train/metrics.h"

namespace moe {

namespace {

std::string unquoted(std::string v) {
  v.erase(std::remove(v.begin(), v.end(), '"'), v.end());
  return v;
}

// Every layout the trainer runs on `gpus` GPUs: DDP with each EP that divides the GPUs of a node,
// the world and the experts; FSDP.
std::vector<RankLayout> layouts(const Config& cfg, int64_t gpus, int64_t gpus_per_node) {
  std::vector<RankLayout> out;
  const bool has_moe = cfg.model.first_k_dense_replace < cfg.model.num_hidden_layers;
  for (int64_t ep = 1; ep <= std::min(gpus, gpus_per_node); ++ep) {
    if (gpus % ep != 0 || cfg.model.num_experts % ep != 0 || (ep > 1 && !has_moe)) continue;
    RankLayout l;
    l.world = gpus, l.mode = "ddp", l.ep = ep;
    out.push_back(l);
  }
  RankLayout f;
  f.world = gpus, f.mode = "fsdp", f.ep = 1;
  out.push_back(f);
  return out;
}

}  // namespace

Config with_changes(Config cfg, const std::vector<std::pair<std::string, std::string>>& changes) {
  for (const auto& [key, value] : changes) {
    const std::string v = unquoted(value);
    if (key == "optim.moment_dtype") {
      MOE_CHECK(v == "bf16" || v == "fp32", "optim.moment_dtype = ", value, ": expected \"bf16\" or \"fp32\"");
      cfg.optim.moment_dtype = v == "bf16" ? DType::BF16 : DType::F32;
    } else if (key == "train.recompute") {
      bool known = false;
      for (Recompute r : {Recompute::None, Recompute::Experts, Recompute::Attention, Recompute::Block})
        if (v == to_string(r)) cfg.train.recompute = r, known = true;
      MOE_CHECK(known, "train.recompute = ", value, " is not a recompute mode");
    } else if (key == "train.micro_batch_size") {
      cfg.train.micro_batch_size = std::stoll(v);
    } else if (key == "parallel.ep") {
      cfg.parallel.ep = std::stoll(v);
    } else {
      throw Error("with_changes: " + key + " is not a lever the topology search applies");
    }
  }
  return cfg;
}

std::string TopologyCandidate::describe() const {
  std::string s = topo.layout.mode == "fsdp" ? "fsdp" : "ddp ep " + std::to_string(topo.layout.ep);
  for (const auto& [key, value] : changes) s += ", " + key + " = " + unquoted(value);
  return s;
}

std::vector<TopologyCandidate> search_topologies(const Config& cfg, int64_t gpus, int64_t nodes,
                                                 const HardwareProfile& hw, Device device) {
  Topology base;
  base.gpus = gpus, base.nodes = nodes, base.layout.world = gpus;
  check_topology(base, hw);
  const double gib = static_cast<double>(size_t{1} << 30);
  const size_t usable = static_cast<size_t>(std::max(0.0, hw.memory_gib - hw.runtime_reserve_gib) * gib);
  std::vector<TopologyCandidate> feasible, refused;
  for (const RankLayout& layout : layouts(cfg, gpus, base.gpus_per_node())) {
    TopologyCandidate c;
    c.topo = base;
    c.topo.layout = layout;
    c.cfg = cfg;
    c.cfg.parallel.mode = layout.mode;
    c.cfg.parallel.ep = layout.ep;
    try {
      c.memory = plan_largest_rank(c.cfg, static_cast<int>(gpus), device);
    } catch (const Error& e) {
      c.why_not = e.what();
      refused.push_back(c);
      continue;
    }
    if (c.memory.total() <= usable) {
      c.feasible = true;
      c.prediction = predict_step(c.cfg, c.topo, hw);
    } else {
      // The fastest lever (or combination) that fits, EP left as enumerated.
      c.why_not = "needs " + format_bytes(static_cast<double>(c.memory.total()) + hw.runtime_reserve_gib * gib) +
                  " per GPU of " + format_bytes(hw.memory_gib * gib) + ", and no memory lever makes it fit";
      for (const FitOption& o : fit_options(c.cfg, static_cast<int>(gpus), device, usable)) {
        if (!o.fits) continue;
        if (std::any_of(o.changes.begin(), o.changes.end(), [](const auto& kv) { return kv.first == "parallel.ep"; }))
          continue;
        const Config x = with_changes(c.cfg, o.changes);
        const StepPrediction p = predict_step(x, c.topo, hw);
        if (!c.feasible || p.step_s < c.prediction.step_s) {
          c.feasible = true, c.changes = o.changes, c.cfg = x, c.memory = o.plan, c.prediction = p;
        }
      }
      c.out_of_memory = !c.feasible;
    }
    c.memory_gib = static_cast<double>(c.memory.total()) / gib + hw.runtime_reserve_gib;
    (c.feasible ? feasible : refused).push_back(c);
  }
  std::stable_sort(feasible.begin(), feasible.end(), [](const TopologyCandidate& a, const TopologyCandidate& b) {
    return a.prediction.tokens_per_s_per_gpu > b.prediction.tokens_per_s_per_gpu;
  });
  feasible.insert(feasible.end(), refused.begin(), refused.end());
  return feasible;
}

std::string format_search(const std::vector<TopologyCandidate>& ranked, const Config& cfg, int64_t gpus, int64_t nodes,
                          const HardwareProfile& hw) {
  std::ostringstream os;
  os << "topologies for '" << cfg.name << "' on " << gpus << " x " << hw.name << " (" << nodes
     << (nodes == 1 ? " node" : " nodes") << "; " << format_bytes(hw.memory_gib * double(size_t{1} << 30))
     << " per GPU), ranked by predicted tokens/s per GPU (" << profile_kind(hw) << ")\n";
  char line[320];
  std::snprintf(line, sizeof line, "%-4s %-44s %12s %10s %14s %7s\n", "rank", "layout", "GPU memory", "step",
                "tokens/s/GPU", "MFU");
  os << line;
  int rank = 0;
  for (const TopologyCandidate& c : ranked) {
    if (!c.feasible) continue;
    std::snprintf(line, sizeof line, "%-4d %-44s %12s %10s %14s %6.1f%%\n", ++rank, c.describe().c_str(),
                  format_bytes(c.memory_gib * double(size_t{1} << 30)).c_str(),
                  format_step_time(c.prediction.step_s).c_str(),
                  format_count(c.prediction.tokens_per_s_per_gpu).c_str(), 100 * c.prediction.mfu);
    os << line;
  }
  // "fits" only when memory is what refused every layout: a layout the config's rules refuse (the
  // batch does not divide among its ranks) would not run on any amount of memory.
  const bool memory_only = !ranked.empty() && std::all_of(ranked.begin(), ranked.end(), [](const TopologyCandidate& c) {
    return c.feasible || c.out_of_memory;
  });
  if (rank == 0)
    os << (memory_only ? "no layout fits in the memory of " : "no layout can run on ") << gpus
       << (gpus == 1 ? " GPU" : " GPUs") << (memory_only ? "\n" : " (each layout's reason below)\n");
  for (const TopologyCandidate& c : ranked)
    if (!c.feasible) os << "refused: " << c.describe() << ": " << c.why_not << "\n";
  return os.str();
}

}  // namespace moe

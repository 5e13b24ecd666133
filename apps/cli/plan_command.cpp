// moetrain plan: each rank's memory plan by role for a config and topology, without a GPU and
// without allocating; with a GPU profile, the predicted step time, and with --search the layouts
// ranked by predicted tokens/s per GPU.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/arguments.h"
#include "cli/command.h"
#include "cli/eval_layout.h"
#include "moe/core/arena.h"
#include "moe/core/error.h"
#include "moe/perf/hardware_profile.h"
#include "moe/perf/prediction_report.h"
#include "moe/perf/step_model.h"
#include "moe/perf/topology_search.h"
#include "moe/train/config.h"
#include "moe/train/memory_plan.h"
#include "moe/train/step_work.h"

namespace moe::cli {

namespace {

struct PlanArgs {
  CLI::App* cmd = nullptr;
  ConfigArgs config;
  int gpus = 1, nodes = 1;
  double memory_gib = 0;
  std::string device, hardware, json;
  bool search = false;
  bool eval = false;  // plan `moetrain eval` of the config: the weights only
};

// --gpu-memory: a decimal number of GiB in range. CLI11 read "0x10" as 16 and "inf" and "nan" as
// numbers, and called "x" a "Value x not in range 0.000001 to 1000000.000000".
const CLI::Validator kGiB(
    [](std::string& text) -> std::string {
      double v = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || v < 1e-6 || v > 1e6)
        return "'" + text + "' is not a number of GiB from 0.000001 to 1000000";
      return "";
    },
    "GiB");

int run_plan(const PlanArgs& a) {
  // The run's own planning code on stand-in ranks (memory_plan.h): nothing is allocated.
  // --eval: the layout `moetrain eval` runs this config under (eval_layout.h), then the user's --set.
  ConfigArgs config = a.config;
  if (a.eval) {
    config.overrides = eval_layout_sets();
    config.overrides.insert(config.overrides.end(), a.config.overrides.begin(), a.config.overrides.end());
  }
  moe::Config cfg = config.load();
  // Without --device, the config's run.device; auto is the GPU in a CUDA build, as a run on a GPU machine.
#if defined(MOE_HAVE_CUDA)
  const bool built_with_cuda = true;
#else
  const bool built_with_cuda = false;
#endif
  const bool gpu = a.device.empty() ? cfg.run.device == "cuda" || (cfg.run.device == "auto" && built_with_cuda)
                                    : a.device == "cuda";
#if !defined(MOE_HAVE_CUDA)
  MOE_CHECK(!gpu, "moetrain plan --device cuda: this binary was built without CUDA (MOE_CUDA=OFF), so it cannot "
            "plan the GPU's buffers (BF16 activations, the GPU dispatcher's heap); build with nvcc, or plan a CPU "
            "run with --device cpu");
#endif
  if (gpu && cfg.train.precision == moe::Precision::FP8) moe::check_fp8_gpu_shapes(cfg);
  // The flags given, named: the error listed all four whichever one was given.
  std::vector<std::string> predicting;
  for (const char* flag : {"--hardware", "--search", "--nodes", "--json"})
    if (a.cmd->count(flag)) predicting.emplace_back(flag);
  if (!predicting.empty() && a.eval) {
    std::fprintf(stderr, "error: --eval plans an evaluation's memory; %s predict%s a training step: drop one\n",
                 predicting[0].c_str(), predicting.size() == 1 ? "s" : " (as the other prediction flags do)");
    return kUsageError;
  }
  if (!predicting.empty() && !gpu) {
    std::string flags;
    for (size_t i = 0; i < predicting.size(); ++i)
      flags += (i == 0 ? "" : i + 1 == predicting.size() ? " and " : ", ") + predicting[i];
    std::fprintf(stderr,
                 "error: %s %s to predict a GPU run's step time, but this plans a CPU run (--device cpu or "
                 "run.device); drop %s, or plan the GPU (--device cuda, in a build with CUDA)\n",
                 flags.c_str(), predicting.size() == 1 ? "asks" : "ask", predicting.size() == 1 ? "it" : "them");
    return kUsageError;
  }
  // Exit 1 here and for an existing file, as for bench and eval: the folder, not the command line, is at fault.
  if (const std::string why = a.json.empty() ? "" : unwritable_output(a.json); !why.empty()) {
    std::fprintf(stderr, "error: plan --json %s cannot be written: %s\n", a.json.c_str(), why.c_str());
    return 1;
  }
  if (!a.json.empty() && std::filesystem::exists(std::filesystem::symlink_status(a.json))) {
    std::fprintf(stderr, "error: plan --json %s exists; choose a new file name (nothing is overwritten)\n",
                 a.json.c_str());
    return 1;  // as for every output that exists (bench --json, eval --logits, export-hf, run.dir)
  }
  if (a.gpus % a.nodes != 0) {
    std::fprintf(stderr, "error: --gpus %d cannot be spread evenly over --nodes %d (see moetrain --help)\n", a.gpus,
                 a.nodes);
    return kUsageError;
  }
  moe::HardwareProfile hw;
  if (gpu) {
    try {
      hw = moe::load_hardware_profile(a.hardware.empty() ? "h200" : a.hardware);
    } catch (const moe::Error& e) {
      std::fprintf(stderr, "error: --hardware: %s\n", e.what());
      return kUsageError;
    }
  }
  // Without --nodes: as few nodes as hold the GPUs, evenly.
  int nodes = a.nodes;
  if (gpu && !a.cmd->count("--nodes")) {
    nodes = (a.gpus + hw.gpus_per_node - 1) / hw.gpus_per_node;
    while (a.gpus % nodes != 0) ++nodes;
  }
  const double gib = a.memory_gib > 0 ? a.memory_gib
                     : gpu            ? hw.memory_gib
                                      : static_cast<double>(moe::physical_memory_bytes()) / (1u << 30) / a.gpus;
  if (gpu && a.memory_gib > 0) hw.memory_gib = a.memory_gib;
  if (a.search) {
    if (cfg.parallel.pp > 1) {
      std::fprintf(stderr, "error: --search ranks layouts without pipeline stages (DDP with each EP, FSDP), but "
                           "parallel.pp = %ld; drop --search to predict this pipeline, or set parallel.pp = 1\n",
                   static_cast<long>(cfg.parallel.pp));
      return kUsageError;
    }
    const auto ranked = moe::search_topologies(cfg, a.gpus, nodes, hw, moe::Device::CUDA);
    std::printf("%s", moe::format_search(ranked, cfg, a.gpus, nodes, hw).c_str());
    if (!a.json.empty()) moe::write_prediction_json(a.json, ranked, hw);
    return 0;
  }
  moe::TopologyCandidate c;
  if (gpu) {
    // Checked first: a layout the hardware cannot hold (an EP group across nodes, more GPUs per
    // node than a node has) is refused before anything prints, never after a "fits" line.
    c.topo.gpus = a.gpus, c.topo.nodes = nodes, c.topo.layout = moe::rank_layout(cfg, a.gpus);
    c.cfg = cfg;
    moe::check_topology(c.topo, hw);
  }
  // Built whole before printing: a config this size cannot run is an error with nothing printed.
  if (a.eval) {
    settle_eval_layout(cfg, a.gpus, a.config.overrides);  // one microbatch per rank; the EP these ranks hold
    cfg.validate();
    std::printf("%s", moe::plan_report(cfg, a.gpus, gpu ? moe::Device::CUDA : moe::Device::CPU,
                                       static_cast<size_t>(gib * (1u << 30)), moe::StoreUse::Evaluation)
                          .c_str());
    return 0;
  }
  const std::string memory_plan = moe::plan_report(cfg, a.gpus, gpu ? moe::Device::CUDA : moe::Device::CPU,
                                                   static_cast<size_t>(gib * (1u << 30)));
  if (gpu) c.prediction = moe::predict_step(cfg, c.topo, hw);
  std::printf("%s", memory_plan.c_str());
  if (gpu) {
    c.memory = moe::plan_largest_rank(cfg, a.gpus, moe::Device::CUDA);
    c.memory_gib = static_cast<double>(c.memory.total()) / (1u << 30) + hw.runtime_reserve_gib;
    c.feasible = c.memory_gib <= hw.memory_gib;
    if (!c.feasible) c.why_not = "does not fit in " + moe::format_bytes(hw.memory_gib * (1u << 30)) + " per GPU";
    std::printf("%s", moe::format_prediction(c.prediction, hw).c_str());
    std::printf("predicted GPU high-water: %s (the plan + %.2f GiB of CUDA context and library workspaces)\n",
                moe::format_bytes(c.memory_gib * (1u << 30)).c_str(), hw.runtime_reserve_gib);
    if (!a.json.empty()) moe::write_prediction_json(a.json, {c}, hw);
  }
  return 0;
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* plan = app.add_subcommand(
      "plan", "each rank's memory plan by role for a config and topology, without a GPU and without allocating; "
              "whether it fits, and which of recompute, moment_dtype, a larger EP or a smaller microbatch would");
  a->cmd = plan;
  a->config.add_to(plan);
  plan->add_option("--gpus", a->gpus, "ranks to plan for (GPUs; CPU processes with --device cpu)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096))
      ->transform(kDecimal);
  plan->add_option("--gpu-memory", a->memory_gib,
                   "memory free on each GPU when the run starts, GiB (default: the --hardware profile's, 139 for the "
                   "h200); with --device cpu, "
                   "memory per rank (default: this machine's physical memory shared by the ranks)")
      ->check(kGiB);
  plan->add_option("--device", a->device, "the device the run will use (default: run.device; auto plans the GPU)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  plan->add_option("--nodes", a->nodes, "nodes the GPUs are spread over (evenly)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096))
      ->transform(kDecimal);
  plan->add_option("--hardware", a->hardware,
                   "GPU profile for the predicted step time: a built-in name (h200, h100, b200, b300) or a JSON "
                   "file (from bench --calibrate); default h200")
      ->check(kNonEmpty);  // "" (an unset variable) planned the default h200 silently
  plan->add_flag("--search", a->search,
                 "rank every layout the trainer runs on --gpus (DDP with each EP, FSDP) by predicted tokens/s per "
                 "GPU, each with its memory and the memory levers it needs to fit");
  plan->add_flag("--eval", a->eval,
                 "plan `moetrain eval` of the config instead of training it: the weights only, no gradients or "
                 "optimizer state, one microbatch per rank");
  plan->add_option("--json", a->json, "also write the prediction (or the ranked search) to this JSON file")
      ->check(kNonEmpty);
  return {plan, [a](Job&) { return run_plan(*a); }, /*agreed_flags=*/nullptr, /*one_process=*/true};
}

}  // namespace moe::cli

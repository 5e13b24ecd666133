// moetrain bench: times N training steps and prints tokens/s, MFU and the step-time split; with
// --check, first compares the fast kernels' loss with the reference kernels'; with --init-from,
// from trained weights; with --calibrate, measures this GPU into a hardware profile for plan
// --hardware instead.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/arguments.h"
#include "cli/command.h"
#include "cli/run_summary.h"
#include "moe/core/error.h"
#include "moe/core/gpu_power.h"
#include "moe/core/kernel_profiler.h"
#include "moe/core/power_summary.h"
#include "moe/ops/kernel_choice.h"
#include "moe/perf/calibrate.h"
#include "moe/perf/hardware_profile.h"
#include "moe/train/bench_report.h"
#include "moe/train/config.h"
#include "moe/train/job_power.h"
#include "moe/train/step_split.h"
#include "moe/train/step_work.h"
#include "moe/train/trainer.h"

namespace moe::cli {

namespace {

// bench --check: fast vs reference kernels on one batch, both BF16 with FP32 accumulation in a
// different order: the losses (~1 to 11 nats) agree to well under 1%.
constexpr double kCheckRelTol = 5e-3;

struct BenchArgs {
  CLI::App* cmd = nullptr;
  ConfigArgs config;
  int64_t steps = 10;
  bool check = false;
  std::string json, calibrate, hardware = "h200", init_from;
  size_t top_kernels = 20;
};

// --calibrate: the GPU's efficiencies into a new hardware profile file.
int run_calibrate(const BenchArgs& a, Job& job) {
  moe::HardwareProfile base;
  const int startup = job.agree_at_startup([&] {
    if (a.cmd->count("--check") || a.cmd->count("--json") || a.cmd->count("--steps") || a.cmd->count("--set") ||
        a.cmd->count("--config") || a.cmd->count("--init-from"))
      throw UsageError("bench --calibrate measures the GPU, not a config: it takes no --config, --set, --steps, "
                       "--json, --check or --init-from (see moetrain --help)");
    // Exit 1: the folder, not the command line, is at fault. Checked before the measurements: a
    // missing or unwritable folder was found only when saving, after minutes of calibration.
    check_new_output("bench --calibrate", a.calibrate);
    try {
      base = moe::load_hardware_profile(a.hardware);
    } catch (const moe::Error& e) {
      throw UsageError(std::string("--hardware: ") + e.what());
    }
  });
  if (startup >= 0) return startup;
  const moe::HardwareProfile measured = moe::calibrate_hardware(base, job.world());
  if (job.leader()) {
    moe::save_hardware_profile(measured, a.calibrate);
    std::printf("hardware profile: %s (use it with moetrain plan --hardware %s)\n", a.calibrate.c_str(),
                a.calibrate.c_str());
  }
  return 0;
}

// The timed steps of the config, and what the printing rank reports of them.
int run_timed_steps(const BenchArgs& a, Job& job) {
  moe::Config cfg;
  const int startup = job.agree_at_startup([&] {
    check_new_output("bench --json", a.json);
    cfg = a.config.load({{"--steps", "train.steps", &moe::TrainConfig::steps, a.steps}});
  });
  if (startup >= 0) return startup;
  moe::TrainOptions opts;
  opts.bench = true;
  // Trained weights: on a GPU at its power limit a step's time follows its energy, which depends
  // on the values multiplied; initial weights flattered FP8 against BF16 by ~3% (bench/RESULTS.md,
  // 2026-12-05).
  opts.init_from = a.init_from;
  moe::KernelProfiler profiler;
  opts.profiler = &profiler;  // used on the GPU only
  moe::PowerMonitor power;
  opts.power = &power;  // each rank's own GPU; used on the GPU only
  moe::Trainer trainer(cfg, opts, job.world());
  if (a.check) {
    // The fast kernels must give the plain reference kernels' loss on the same batch (BF16
    // rounding apart) before any timing is worth reading.
    moe::set_kernel_choice(moe::KernelChoice::Reference);
    const double plain = trainer.microbatch_loss(0);
    moe::set_kernel_choice(moe::KernelChoice::Fast);
    const double fast = trainer.microbatch_loss(0);
    const double rel = std::abs(fast - plain) / std::max(std::abs(plain), 1e-12);
    if (job.leader())
      std::printf("check: first microbatch loss %.6f with the fast kernels, %.6f with the reference kernels "
                  "(relative difference %.2e, bar %.0e)\n",
                  fast, plain, rel, kCheckRelTol);
    MOE_CHECK(rel <= kCheckRelTol, "bench --check: the fast kernels' loss ", fast, " differs from the reference ",
              "kernels' ", plain, " by ", rel, " (relative), more than ", kCheckRelTol);
  }
  const moe::TrainSummary s = trainer.run();
  // Every rank's GPU over the timed steps, each GPU once (collective: every rank of a GPU run has
  // the same device and steps).
  std::optional<moe::JobPower> job_power;
  if (s.device == moe::Device::CUDA && s.steps.size() > 1)
    job_power = moe::gather_job_power(job.world(), s.power, power.why());
  if (!job.leader()) return 0;
  std::vector<moe::SplitRow> split;
  moe::Ceilings ceilings;
  print_summary(s, true);
  const double ideal = s.mean_step_time_s * s.mean_mfu;
  std::printf("  step-time split: ideal model time at peak %.4f s, the rest (tax) %.4f s (%.1f%%); "
              "in collectives %.4f s",
              ideal, s.mean_step_time_s - ideal, 100 * (1 - s.mean_mfu), s.mean_comm_time_s);
  if (s.device == moe::Device::CPU)
    std::printf(", optimizer step %.4f s (gradient reduction after the backward %.4f s)\n", s.mean_optimizer_time_s,
                s.mean_reduction_wait_time_s);
  else
    std::printf(" (GPU work is asynchronous: the kernel table below splits the step)\n");
  if (s.device == moe::Device::CUDA) {
    if (!profiler.available())
      std::printf("  top kernels: not recorded (%s)\n", profiler.why().c_str());
    else if (s.steps.size() > 1) {
      const int timed = static_cast<int>(s.steps.size() - 1);
      std::printf("%s", moe::format_kernel_table(profiler.top(a.top_kernels), profiler.total_ms(), timed).c_str());
      // Each kind of kernel against its ceiling, measured now on the same GPU.
      ceilings = moe::measure_ceilings(cfg.train.precision == moe::Precision::FP8);
      // The printing rank's own work: under pp, stage 0's (job rank 0 is in stage 0).
      const moe::StepWork work = moe::step_work(cfg, moe::rank_layout(cfg, job.world().size(), /*stage=*/0));
      split = moe::split_step(profiler.top(SIZE_MAX), timed, work, ceilings);
      std::printf("%s", moe::format_step_split(split, ceilings).c_str());
    }
  }
  if (job_power) {
    const double tokens_per_step = static_cast<double>(cfg.train.global_batch_size * cfg.train.seq_len);
    std::printf("%s", moe::format_job_power(*job_power, s.mean_step_time_s, tokens_per_step).c_str());
  }
  if (!a.json.empty()) {
    moe::write_bench_report(a.json, cfg, s, job.world().size(), split, ceilings, job_power ? &*job_power : nullptr);
    std::printf("  report: %s\n", a.json.c_str());
  }
  return 0;
}

int run_bench(const BenchArgs& a, Job& job) {
  if (!a.calibrate.empty()) return run_calibrate(a, job);
  if (a.cmd->count("--hardware"))
    return job.error_once("bench --hardware names the base profile of --calibrate; give --calibrate OUT.json "
                          "too (see moetrain --help)",
                          kUsageError);
  return run_timed_steps(a, job);
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* bench =
      app.add_subcommand("bench", "time N training steps; prints tokens/s, MFU and the step-time split");
  a->cmd = bench;
  a->config.add_to(bench);
  bench->add_option("--steps", a->steps, "steps to run")
      ->capture_default_str()
      ->check(kCountFromOne)
      ->transform(kDecimal);
  bench->add_option("--json", a->json,
                    "also write the run's numbers (throughput, MFU, step split) to this JSON file (rank 0)")
      ->check(kNonEmpty);
  bench->add_option("--calibrate", a->calibrate,
                    "measure this GPU's efficiencies (GEMMs, attention, memory; the links under mpirun) alone and "
                    "inside profiled steps of the built-in bench-olmoe-4l into a new hardware profile JSON file for "
                    "plan --hardware, instead of training")
      ->check(kNonEmpty);
  bench->add_option("--hardware", a->hardware,
                    "with --calibrate: the profile whose peaks and unmeasured curves the result keeps (built-in name "
                    "or file)")
      ->capture_default_str();
  bench->add_option("--top-kernels", a->top_kernels, "rows of the GPU kernel table (the heaviest kernels first)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1000}))
      ->transform(kDecimal);
  bench->add_option("--init-from", a->init_from,
                    "time the steps from the weights of a checkpoint dir, a run dir (its newest checkpoint) or a Hugging "
                    "Face OLMoE folder instead of the initial ones (fresh optimizer state; the model config must match)")
      ->check(kNonEmpty);
  bench->add_flag("--check", a->check,
                  "first compare one batch's loss between the fast and the reference kernels; fail if they differ");
  // Each mode runs other collectives; every rank must start from the same weights.
  auto agreed_flags = [a] {
    return std::string(a->check ? " --check" : "") + (a->calibrate.empty() ? "" : " --calibrate") +
           (a->init_from.empty() ? "" : " --init-from '" + a->init_from + "'");
  };
  return {bench, [a](Job& job) { return run_bench(*a, job); }, agreed_flags};
}

}  // namespace moe::cli

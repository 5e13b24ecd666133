// `moetrain bench --json PATH`: one run's numbers as a JSON object, for scripts that sweep
// configurations (bench/figure4.sh) and plots (python/plot_figure4.py). Written atomically
// (temp file, fsync, rename): a reader sees the whole report or none.
//
//   config, device, world_size, parallel_mode, ep, pp, pp_virtual, pp_schedule, pp_layers, ep_backend,
//   ep_payload, num_experts, experts_per_token, num_layers, moe_layers, hidden_size, seq_len, precision,
//   recompute, init_from (bench --init-from: {path, format, step, run_id} of the weights; null: the
//   config's initial ones), steps_timed, first_step_timed,
//   tokens_per_s (all ranks), tokens_per_s_per_gpu, mfu (per device), step_s, comm_s, reduction_wait_s
//   (CPU: gradient reduction after the backward), graph_nodes, gpu_peak_bytes, arena_bytes, final_loss,
//   total_params, active_params, ceilings {gemm_tflops, fp8_gemm_tflops, copy_tb_s}, split [{kind,
//   ms_per_step, share, rate, unit, ceiling, fp8_cache_ms}] (GPU runs with the kernel profiler; empty
//   otherwise) and power {gpus (distinct GPUs: ranks sharing one count it once), energy_j_per_step
//   (summed over the GPUs), tokens_per_j (the job's), mean_w_per_gpu (these three null unless every
//   rank's GPU gave an energy window), unmeasured ["rank R: why"], per_gpu [{host, gpu (PCI bus id),
//   energy_j_per_step (mean_w x step_s), mean_w, energy_window_s (these three null when its energy
//   counter advanced fewer than twice), energy_updates, limit_w, sm_clock_mhz_mean, sm_clock_mhz_max,
//   samples, power_capped_samples, thermal_samples, hardware_slowdown_samples, note}]} (every rank's
//   GPU over the timed steps, from NVML; null for a CPU run or a run of one step).
#pragma once

#include <string>
#include <vector>

#include "moe/core/power_summary.h"
#include "moe/train/config.h"
#include "moe/train/step_split.h"
#include "moe/train/trainer.h"

namespace moe {

// power: the job's GPUs (null: not gathered, as for a CPU run).
std::string bench_report_json(const Config& cfg, const TrainSummary& s, int world_size,
                              const std::vector<SplitRow>& split, const Ceilings& ceilings, const JobPower* power);
void write_bench_report(const std::string& path, const Config& cfg, const TrainSummary& s, int world_size,
                        const std::vector<SplitRow>& split, const Ceilings& ceilings, const JobPower* power);

}  // namespace moe

// `moetrain bench --json PATH`: one run's numbers as a JSON object, for scripts that sweep
// configurations (bench/figure4.sh) and plots (python/plot_figure4.py). Written atomically
// (temp file, fsync, rename): a reader sees the whole report or none.
//
//   config, device, world_size, parallel_mode, ep, pp, pp_virtual, pp_schedule, pp_layers, ep_backend,
//   ep_payload, num_experts, experts_per_token, num_layers, moe_layers, hidden_size, seq_len, steps_timed,
//   tokens_per_s (all ranks), tokens_per_s_per_gpu, mfu (per device), step_s, comm_s, reduction_wait_s
//   (CPU: gradient reduction after the backward), graph_nodes, gpu_peak_bytes, arena_bytes, final_loss,
//   total_params, active_params, ceilings {gemm_tflops, fp8_gemm_tflops, copy_tb_s}, split [{kind,
//   ms_per_step, share, rate, unit, ceiling, fp8_cache_ms}] (GPU runs with the kernel profiler; empty
//   otherwise) and power {energy_j_per_step (mean_w x step_s), mean_w, energy_window_s (these three null
//   when the energy counter advanced fewer than twice), energy_updates, limit_w, sm_clock_mhz_mean,
//   sm_clock_mhz_max, samples, power_capped_samples, thermal_samples, hardware_slowdown_samples, note}
//   (rank 0's GPU over the timed steps, from NVML; null without it).
#pragma once

#include <string>
#include <vector>

#include "moe/train/config.h"
#include "moe/train/step_split.h"
#include "moe/train/trainer.h"

namespace moe {

std::string bench_report_json(const Config& cfg, const TrainSummary& s, int world_size,
                              const std::vector<SplitRow>& split, const Ceilings& ceilings);
void write_bench_report(const std::string& path, const Config& cfg, const TrainSummary& s, int world_size,
                        const std::vector<SplitRow>& split, const Ceilings& ceilings);

}  // namespace moe

#include "moe/train/bench_report.h"

#include <nlohmann/json.hpp>

#include "moe/ckpt/durable_file.h"
#include "moe/core/device.h"
#include "moe/core/error.h"
#include "moe/train/flops.h"

namespace moe {

std::string bench_report_json(const Config& cfg, const TrainSummary& s, int world_size,
                              const std::vector<SplitRow>& split, const Ceilings& ceilings) {
  MOE_CHECK(world_size >= 1, "bench report: world size ", world_size);
  MOE_CHECK(!s.steps.empty(), "bench report: no steps were run");
  const FlopCount f = count_flops(cfg.model, cfg.train.seq_len);
  nlohmann::ordered_json j;
  j["config"] = cfg.name;
  j["device"] = device_name(s.device);
  j["world_size"] = world_size;
  j["parallel_mode"] = cfg.parallel.mode;
  j["ep"] = cfg.parallel.mode == "fsdp" ? 1 : cfg.parallel.ep;
  j["pp"] = cfg.parallel.pp;  // world_size = pp x data-parallel ranks
  j["pp_virtual"] = cfg.parallel.pp_virtual;
  j["pp_schedule"] = cfg.parallel.pp_schedule;
  j["pp_layers"] = cfg.parallel.pp_layers;
  j["ep_backend"] = cfg.ep.backend;
  j["ep_payload"] = to_string(cfg.ep.payload);
  j["num_experts"] = cfg.model.num_experts;
  j["experts_per_token"] = cfg.model.num_experts_per_tok;
  j["num_layers"] = cfg.model.num_hidden_layers;
  j["moe_layers"] = cfg.model.num_hidden_layers - cfg.model.first_k_dense_replace;
  j["hidden_size"] = cfg.model.hidden_size;
  j["seq_len"] = cfg.train.seq_len;
  j["precision"] = to_string(cfg.train.precision);
  j["recompute"] = to_string(cfg.train.recompute);
  j["steps_timed"] = s.timed_steps;
  j["first_step_timed"] = s.first_step_timed;
  j["tokens_per_s"] = s.mean_tokens_per_s;
  j["tokens_per_s_per_gpu"] = s.mean_tokens_per_s / world_size;
  j["mfu"] = s.mean_mfu;
  j["step_s"] = s.mean_step_time_s;
  j["comm_s"] = s.mean_comm_time_s;
  j["reduction_wait_s"] = s.mean_reduction_wait_time_s;
  j["graph_nodes"] = s.graph_nodes;
  j["gpu_peak_bytes"] = s.device_peak_bytes;
  j["arena_bytes"] = s.arena_bytes;
  j["final_loss"] = s.steps.back().loss;
  j["total_params"] = f.total_params;
  j["active_params"] = f.active_params;
  j["ceilings"] = {{"gemm_tflops", ceilings.gemm_tflops},
                   {"fp8_gemm_tflops", ceilings.fp8_gemm_tflops},
                   {"copy_tb_s", ceilings.copy_tb_s}};
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const SplitRow& r : split)
    rows.push_back({{"kind", kernel_group_name(r.group)},
                    {"ms_per_step", r.ms_per_step},
                    {"share", r.share},
                    {"rate", r.rate},
                    {"unit", r.unit},
                    {"ceiling", r.ceiling},
                    {"fp8_cache_ms", r.fp8_cache_ms}});
  j["split"] = rows;
  if (s.power) {  // rank 0's GPU over the timed steps
    const PowerSummary& p = *s.power;
    const auto measured = [&](double v) { return p.energy_measured ? nlohmann::ordered_json(v) : nullptr; };
    j["power"] = {{"energy_j_per_step", measured(p.mean_power_w() * s.mean_step_time_s)},
                  {"mean_w", measured(p.mean_power_w())},
                  {"energy_window_s", measured(p.seconds)},
                  {"energy_updates", p.energy_updates},
                  {"limit_w", p.limit_w},
                  {"sm_clock_mhz_mean", p.mean_sm_clock_mhz},
                  {"sm_clock_mhz_max", p.max_sm_clock_mhz},
                  {"samples", p.samples},
                  {"power_capped_samples", p.power_capped},
                  {"thermal_samples", p.thermal},
                  {"hardware_slowdown_samples", p.hardware_slowdown},
                  {"note", p.note}};
  } else {
    j["power"] = nullptr;
  }
  return j.dump(2) + "\n";
}

void write_bench_report(const std::string& path, const Config& cfg, const TrainSummary& s, int world_size,
                        const std::vector<SplitRow>& split, const Ceilings& ceilings) {
  write_file_atomic(path, bench_report_json(cfg, s, world_size, split, ceilings));
}

}  // namespace moe

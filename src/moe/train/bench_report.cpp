#include "moe/train/bench_report.h"

#include <nlohmann/json.hpp>

#include "moe/ckpt/durable_file.h"
#include "moe/core/device.h"
#include "moe/core/error.h"
#include "moe/train/flops.h"

namespace moe {

std::string bench_report_json(const Config& cfg, const TrainSummary& s, int world_size,
                              const std::vector<SplitRow>& split, const Ceilings& ceilings, const JobPower* power) {
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
  j["deterministic"] = cfg.train.deterministic;  // the attention backward's algorithm: its speed differs
  j["init_from"] = s.init_from;  // null: the config's initial weights
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
  if (power != nullptr) {  // with no GPU read, the reasons stay in unmeasured
    const auto when = [](bool measured, double v) { return measured ? nlohmann::ordered_json(v) : nullptr; };
    const bool job_measured = power->energy_measured();
    const double job_j = power->energy_per_step_j(s.mean_step_time_s);
    const double tokens = static_cast<double>(cfg.train.global_batch_size * cfg.train.seq_len);
    nlohmann::ordered_json gpus = nlohmann::ordered_json::array();
    for (const PowerSummary& p : power->gpus)
      gpus.push_back({{"host", p.host},
                      {"gpu", p.gpu},
                      {"energy_j_per_step", when(p.energy_measured, p.energy_per_step_j(s.mean_step_time_s))},
                      {"mean_w", when(p.energy_measured, p.mean_power_w())},
                      {"energy_window_s", when(p.energy_measured, p.seconds)},
                      {"energy_updates", p.energy_updates},
                      {"limit_w", p.limit_w},
                      {"sm_clock_mhz_mean", p.mean_sm_clock_mhz},
                      {"sm_clock_mhz_max", p.max_sm_clock_mhz},
                      {"samples", p.samples},
                      {"power_capped_samples", p.power_capped},
                      {"thermal_samples", p.thermal},
                      {"hardware_slowdown_samples", p.hardware_slowdown},
                      {"note", p.note}});
    j["power"] = {{"gpus", power->gpus.size()},
                  {"energy_j_per_step", when(job_measured, job_j)},
                  {"tokens_per_j", when(job_measured && job_j > 0, job_j > 0 ? tokens / job_j : 0.0)},
                  {"mean_w_per_gpu", when(job_measured, power->mean_power_per_gpu_w())},
                  {"unmeasured", power->unmeasured},
                  {"per_gpu", gpus}};
  } else {
    j["power"] = nullptr;
  }
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";  // NVML's texts may not be UTF-8
}

void write_bench_report(const std::string& path, const Config& cfg, const TrainSummary& s, int world_size,
                        const std::vector<SplitRow>& split, const Ceilings& ceilings, const JobPower* power) {
  write_new_file_atomic(path, bench_report_json(cfg, s, world_size, split, ceilings, power), "bench --json");
}

}  // namespace moe

#include "moe/perf/step_model.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "moe/core/error.h"
#include "moe/optim/distributed_adamw.h"
#include "moe/train/metrics.h"

namespace moe {

namespace {

constexpr double kTera = 1e12, kGiga = 1e9;

// A ring collective over `ranks` ranks that span more than one node runs at the network adapter's
// rate, inside one node at NVLink's.
double link_gb_s(const Topology& t, int64_t ranks_spanned, const HardwareProfile& hw, double message_bytes,
                 double* efficiency) {
  const bool across_nodes = ranks_spanned > t.gpus_per_node();
  *efficiency = across_nodes ? hw.collective_inter.at(message_bytes) : hw.collective_intra.at(message_bytes);
  return (across_nodes ? hw.inter_node_gb_s : hw.intra_node_gb_s) * *efficiency;
}

// (n - 1) / n: the share of a ring collective's full-size buffer each rank sends (and receives).
double ring_factor(int64_t n) { return n <= 1 ? 0 : static_cast<double>(n - 1) / static_cast<double>(n); }

// printf into a string as long as the numbers make it: a fixed line buffer whose remaining size was
// computed from snprintf's would-be length wrapped around past its end on a 1e300 ms part and
// wrote beyond it.
[[gnu::format(printf, 1, 2)]] std::string formatted(const char* format, ...) {
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  std::vsnprintf(out.data(), out.size() + 1, format, again);
  va_end(again);
  return out;
}

}  // namespace

void check_topology(const Topology& t, const HardwareProfile& hw) {
  MOE_CHECK(t.gpus >= 1 && t.nodes >= 1 && t.gpus % t.nodes == 0, "--gpus ", t.gpus, " cannot be spread evenly over ",
            "--nodes ", t.nodes, ": give a number of GPUs that the nodes divide");
  MOE_CHECK(t.gpus_per_node() <= hw.gpus_per_node, t.gpus, " GPUs on ", t.nodes, t.nodes == 1 ? " node" : " nodes",
            " is ", t.gpus_per_node(), " per node, but a ", hw.name, " node holds ", hw.gpus_per_node,
            ": use --nodes ", (t.gpus + hw.gpus_per_node - 1) / hw.gpus_per_node, " or more");
  MOE_CHECK(t.layout.world == t.gpus, "topology: the layout has ", t.layout.world, " ranks for ", t.gpus, " GPUs");
  MOE_CHECK(t.layout.mode == "fsdp" || t.layout.ep <= t.gpus_per_node(), "parallel.ep = ", t.layout.ep,
            " spans more than one node (", t.gpus_per_node(), " GPUs per node): an EP group must stay inside a node; "
            "set parallel.ep to at most ", t.gpus_per_node());
}

StepPrediction predict_step(const Config& cfg, const Topology& topo, const HardwareProfile& hw) {
  check_topology(topo, hw);
  StepPrediction p;
  p.work = step_work(cfg, topo.layout);
  const StepWork& w = p.work;
  const double bf16 = hw.peak_bf16_tflops * kTera, fp8 = hw.peak_fp8_tflops * kTera, mem = hw.memory_tb_s * kTera;
  const double d = static_cast<double>(cfg.model.hidden_size);
  auto add = [&](const char* name, double seconds, double work, const char* unit, double eff) {
    p.parts.push_back({name, seconds, work, unit, eff});
  };

  // Matrix products.
  const double e_expert = w.fp8_experts ? hw.gemm_grouped_fp8.at(w.rows_per_expert)
                                        : hw.gemm_grouped_bf16.at(w.rows_per_expert);
  const double e_stream = hw.optimizer.at(w.expert_grad_accumulate_bytes);
  add("expert GEMMs",
      w.expert_flops / ((w.fp8_experts ? fp8 : bf16) * e_expert) +
          (w.expert_grad_accumulate_bytes > 0 ? w.expert_grad_accumulate_bytes / (mem * e_stream) : 0),
      w.expert_flops, "FLOP", e_expert);
  const double e_dense = hw.gemm_dense_bf16.at(d), e_dense8 = hw.gemm_dense_fp8.at(d);
  add("dense GEMMs",
      (w.dense_flops - w.fp8_dense_flops) / (bf16 * e_dense) + (w.fp8_dense_flops > 0 ? w.fp8_dense_flops / (fp8 * e_dense8) : 0),
      w.dense_flops, "FLOP", e_dense);
  const double e_attn = hw.attention.at(static_cast<double>(cfg.train.seq_len));
  add("attention", w.attention_flops / (bf16 * e_attn), w.attention_flops, "FLOP", e_attn);
  // Memory-bound passes.
  const double e_elem = hw.elementwise.at(w.elementwise_bytes);
  add("element-wise, routing", w.elementwise_bytes / (mem * e_elem), w.elementwise_bytes, "B", e_elem);
  const double fp8_bytes = w.fp8_quantize_bytes + w.fp8_cache_bytes;
  const double e_quant = hw.fp8_quantize.at(fp8_bytes);
  add("FP8 quantize", fp8_bytes / (mem * e_quant), fp8_bytes, "B", fp8_bytes > 0 ? e_quant : 0);
  const double opt_bytes = w.adamw_bytes + w.grad_norm_bytes + w.optimizer_other_bytes;
  const double e_opt = hw.optimizer.at(opt_bytes);
  add("optimizer", opt_bytes / (mem * e_opt), opt_bytes, "B", e_opt);
  double compute = 0;
  for (const PredictedPart& part : p.parts)
    if (part.name != "optimizer") compute += part.seconds;

  // Gradient reduction of each replica group (ZeRO-1, F32 both ways, 16 MiB buckets). The expert
  // replicas of one EP slice are every ep-th rank: they span as many GPUs as the data-parallel ranks.
  const double bucket = static_cast<double>(DistributedAdamW::kDefaultBucketBytes);
  const double dp = static_cast<double>(topo.layout.dp());
  double sync_bytes = 0, sync_s = 0, e_sync = 0;
  for (auto [params, group] : {std::pair{w.dense_grad_params, w.dense_group}, {w.expert_grad_params, w.expert_group}}) {
    if (group <= 1) continue;
    const double bytes = 2 * 4 * params * ring_factor(group);
    sync_bytes += bytes;
    sync_s += bytes / (link_gb_s(topo, static_cast<int64_t>(dp), hw, bucket, &e_sync) * kGiga);
  }
  add("gradient reduction", sync_s, sync_bytes, "B", sync_bytes > 0 ? e_sync : 0);

  // Routed rows to and from the other GPUs of the EP group (inside one node).
  const int64_t ep = topo.layout.mode == "fsdp" ? 1 : topo.layout.ep;
  const double pass_bytes = w.tokens_per_microbatch * static_cast<double>(cfg.model.num_experts_per_tok) * d * 2 *
                            ring_factor(ep);
  const double e_disp = hw.dispatch_intra.at(pass_bytes);
  const double dispatch_s = w.dispatch_bytes > 0 ? w.dispatch_bytes / (hw.intra_node_gb_s * kGiga * e_disp) : 0;
  add("dispatch/combine", dispatch_s, w.dispatch_bytes, "B", w.dispatch_bytes > 0 ? e_disp : 0);
  compute += dispatch_s;

  // FSDP: each block gathered (BF16) and its gradient reduce-scattered (F32), one block at a time;
  // on one rank both are device copies (read and write).
  double fsdp_bytes = (w.fsdp_gather_bytes + w.fsdp_reduce_bytes) * ring_factor(w.fsdp_group);
  double e_fsdp = 0, fsdp_s = 0;
  if (fsdp_bytes > 0) {
    const double block = w.fsdp_gather_bytes / (2 * w.microbatches) /
                         static_cast<double>(cfg.model.num_hidden_layers + 2);  // mean BF16 block
    fsdp_s = fsdp_bytes / (link_gb_s(topo, w.fsdp_group, hw, block, &e_fsdp) * kGiga);
  } else if (w.fsdp_gather_bytes > 0) {
    fsdp_bytes = 2 * (w.fsdp_gather_bytes + w.fsdp_reduce_bytes);
    e_fsdp = hw.optimizer.at(fsdp_bytes);
    fsdp_s = fsdp_bytes / (mem * e_fsdp);
  }
  add("FSDP gathers", fsdp_s, fsdp_bytes, "B", e_fsdp);
  compute += fsdp_s;

  // 1F1B: (P - 1) idle slots of a microbatch's forward and backward on every stage; interleaved
  // with V chunks per stage: of a chunk's, (P - 1) / (V m). Not modelled: the stage messages.
  const double stages = static_cast<double>(w.pipeline_stages);
  const double chunks_per_stage = static_cast<double>(w.pipeline_virtual_stages);
  add("pipeline bubble", stages > 1 ? compute * (stages - 1) / (chunks_per_stage * w.microbatches) : 0, 0, "", 0);

  for (const PredictedPart& part : p.parts) {
    // A profile built in code (the calibration's, a test's) is not bounded as a file is: an
    // efficiency of 5e-324 made this part inf s and the step "0 tokens/s", printed as a prediction.
    MOE_CHECK(std::isfinite(part.seconds) && part.seconds >= 0, "the performance model on ", hw.name, " times '",
              part.name, "' at ", part.seconds, " s (", part.work, " ", part.unit, " at efficiency ", part.efficiency,
              "): the hardware profile's rates and efficiencies must be positive and finite");
    p.step_s += part.seconds;
  }
  const double tokens_per_gpu = w.tokens / stages;
  p.tokens_per_s_per_gpu = tokens_per_gpu / p.step_s;
  p.mfu = count_flops(cfg.model, cfg.train.seq_len).flops_per_token * p.tokens_per_s_per_gpu / bf16;
  if (cfg.train.deterministic)
    p.caveat = "attention is timed with cuDNN's default backward: train.deterministic's algorithm is not modelled";
  return p;
}

std::string format_prediction(const StepPrediction& p, const HardwareProfile& hw) {
  std::string out =
      "predicted step on " + hw.name + " (" + profile_kind(hw) + ")" +
      formatted(": %s, %s tokens/s per GPU, MFU %.1f%% of %.0f TFLOP/s\n", format_step_time(p.step_s).c_str(),
                format_count(p.tokens_per_s_per_gpu).c_str(), 100 * p.mfu, hw.peak_bf16_tflops);
  for (const PredictedPart& part : p.parts) {
    if (part.seconds <= 0) continue;
    out +=
        formatted("    %-22s %9.2f ms %6.1f%%", part.name.c_str(), 1e3 * part.seconds, 100 * part.seconds / p.step_s);
    if (part.work > 0) {
      const bool flops = std::string(part.unit) == "FLOP";
      out += formatted("   %8.2f %s", part.work / (flops ? 1e12 : 1e9), flops ? "TFLOP" : "GB");
      if (part.efficiency > 0)
        out +=
            formatted(" at %3.0f%% of the %s", 100 * part.efficiency,
                      flops ? "peak"
                      : part.name == "element-wise, routing" || part.name == "optimizer" || part.name == "FP8 quantize"
                          ? "memory bandwidth"
                          : "link");
    }
    out += '\n';
  }
  if (!p.caveat.empty()) out += "    (" + p.caveat + ")\n";
  return out;
}

}  // namespace moe

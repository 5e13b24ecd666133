#include "moe/perf/step_fit.h"

#include <cstdio>
#include <initializer_list>

#include "moe/core/error.h"

namespace moe {

namespace {

constexpr double kTera = 1e12;

// GPU seconds per step of the groups, all of which must have run.
double seconds_of(const ReferenceStep& ref, std::initializer_list<KernelGroup> groups) {
  double ms = 0;
  for (KernelGroup g : groups) {
    double group_ms = 0;
    for (const SplitRow& r : ref.split)
      if (r.group == g) group_ms = r.ms_per_step;
    MOE_CHECK(group_ms > 0, "fitting the profile to ", ref.name, ": the step split has no '", kernel_group_name(g),
              "' kernels (the kernel profiler recorded none of that kind)");
    ms += group_ms;
  }
  return ms * 1e-3;
}

std::string group_names(std::initializer_list<KernelGroup> groups) {
  std::string s;
  for (KernelGroup g : groups) s += (s.empty() ? "" : " + ") + std::string(kernel_group_name(g));
  return s;
}

// Sets `curve`'s factor so that it gives `work` / (`peak` x `seconds`) at `x`. `less`: what of the
// groups' time other parts of the model account for (in the source; already out of `seconds`).
InStepFit fit(EfficiencyCurve& curve, const char* key, std::initializer_list<KernelGroup> groups, double seconds,
              double work, double peak, double x, const char* work_unit, const ReferenceStep& ref,
              const std::string& less = "") {
  MOE_CHECK(seconds > 0 && work > 0, "fitting ", key, " to ", ref.name, ": ", work, " ", work_unit, " in ",
            1e3 * seconds, " ms is no rate");
  InStepFit f;
  f.curve = key;
  f.groups = group_names(groups);
  f.ms = 1e3 * seconds;
  f.efficiency = work / (peak * seconds);
  f.alone = curve.points_at(x);
  f.factor = f.efficiency / f.alone;
  // The bounds of the profile file's parser (hardware_profile.h): a fit outside them wrote a
  // profile that `plan --hardware` then refused, after the whole calibration had run.
  MOE_CHECK(f.factor >= kMinInStepFactor && f.factor <= kMaxInStepFactor, "fitting ", key, " to ", ref.name,
            ": in the step it reaches ", f.efficiency, " of the peak, ", f.factor, " times what its points give (",
            f.alone, "); a factor outside [", kMinInStepFactor, ", ", kMaxInStepFactor,
            "] means the points or the step split are wrong");
  for (const auto& [point_x, point] : curve.points)
    MOE_CHECK(point * f.factor <= max_efficiency(key), "fitting ", key, " to ", ref.name, ": in the step it reaches ",
              f.efficiency, " of the peak, so its point at x = ", point_x, " (", point, ") would reach ",
              point * f.factor, ", above the ", max_efficiency(key), " of the peak a ", key,
              " curve may: the step split or the model's work count is wrong");
  const bool flops = std::string(work_unit) == "FLOP";
  char how[400];
  std::snprintf(how, sizeof how,
                "fitted: %s's %s kernels in the step split, %.2f ms per step%s, over the model's %.2f %s: %.1f%% of "
                "the %s, where the points give %.1f%% at %s %.4g",
                ref.name.c_str(), f.groups.c_str(), f.ms, less.c_str(), work / (flops ? kTera : 1e9),
                flops ? "TFLOP" : "GB", 100 * f.efficiency, flops ? "peak" : "memory bandwidth", 100 * f.alone,
                curve.x.c_str(), x);
  curve.in_step = f.factor;
  curve.in_step_source = how;
  return f;
}

// The expert gradients' F32 reads where microbatches accumulate: the model adds them to the expert
// GEMMs' time at the optimizer rate.
double accumulate_seconds(const HardwareProfile& p, const StepWork& w) {
  const double bytes = w.expert_grad_accumulate_bytes;
  return bytes > 0 ? bytes / (p.memory_tb_s * kTera * p.optimizer.at(bytes)) : 0;
}

std::string accumulate_note(double seconds) {
  if (seconds <= 0) return "";
  char s[96];
  std::snprintf(s, sizeof s, " (less %.2f ms of F32 expert-gradient reads at the optimizer rate)", 1e3 * seconds);
  return s;
}

}  // namespace

std::vector<InStepFit> fit_bf16_step(HardwareProfile& p, const ReferenceStep& ref) {
  const StepWork& w = ref.work;
  MOE_CHECK(!w.fp8_experts && w.fp8_quantize_bytes == 0 && w.fp8_dense_flops == 0, "fit_bf16_step: ", ref.name,
            " is an FP8 step (train.precision = fp8); fit it with fit_fp8_step");
  const double bf16 = p.peak_bf16_tflops * kTera, mem = p.memory_tb_s * kTera;
  using G = KernelGroup;
  std::vector<InStepFit> fits;
  const double opt_bytes = w.adamw_bytes + w.grad_norm_bytes;
  fits.push_back(fit(p.optimizer, "optimizer", {G::AdamW, G::GradNorm}, seconds_of(ref, {G::AdamW, G::GradNorm}),
                     opt_bytes, mem, opt_bytes, "B", ref));
  fits.push_back(fit(p.elementwise, "elementwise", {G::Other}, seconds_of(ref, {G::Other}), w.elementwise_bytes, mem,
                     w.elementwise_bytes, "B", ref));
  const double accumulate_s = accumulate_seconds(p, w);
  fits.push_back(fit(p.gemm_grouped_bf16, "gemm_grouped_bf16", {G::ExpertGemm},
                     seconds_of(ref, {G::ExpertGemm}) - accumulate_s, w.expert_flops, bf16, w.rows_per_expert, "FLOP", ref,
                     accumulate_note(accumulate_s)));
  fits.push_back(fit(p.gemm_dense_bf16, "gemm_dense_bf16", {G::DenseGemm}, seconds_of(ref, {G::DenseGemm}),
                     w.dense_flops, bf16, ref.d_model, "FLOP", ref));
  fits.push_back(fit(p.attention, "attention", {G::Attention}, seconds_of(ref, {G::Attention}), w.attention_flops, bf16,
                     ref.seq_len, "FLOP", ref));
  return fits;
}

std::vector<InStepFit> fit_fp8_step(HardwareProfile& p, const ReferenceStep& ref) {
  const StepWork& w = ref.work;
  MOE_CHECK(w.fp8_experts && w.fp8_quantize_bytes > 0 && w.fp8_dense_flops > 0, "fit_fp8_step: ", ref.name,
            " is not an FP8 step (train.precision = fp8 with FP8 expert and dense products)");
  const double bf16 = p.peak_bf16_tflops * kTera, fp8 = p.peak_fp8_tflops * kTera, mem = p.memory_tb_s * kTera;
  using G = KernelGroup;
  std::vector<InStepFit> fits;
  const double fp8_bytes = w.fp8_quantize_bytes + w.fp8_cache_bytes;
  // One rank writes the caches inside AdamW (no cache kernels; their bytes are AdamW's); several
  // ranks refresh them in a pass of their own, priced with the quantizers.
  if (w.fp8_cache_bytes > 0)
    fits.push_back(fit(p.fp8_quantize, "fp8_quantize", {G::Fp8Quantize, G::Fp8Cache},
                       seconds_of(ref, {G::Fp8Quantize, G::Fp8Cache}), fp8_bytes, mem, fp8_bytes, "B", ref));
  else
    fits.push_back(fit(p.fp8_quantize, "fp8_quantize", {G::Fp8Quantize}, seconds_of(ref, {G::Fp8Quantize}),
                       fp8_bytes, mem, fp8_bytes, "B", ref));
  const double accumulate_s = accumulate_seconds(p, w);
  fits.push_back(fit(p.gemm_grouped_fp8, "gemm_grouped_fp8", {G::ExpertGemm},
                     seconds_of(ref, {G::ExpertGemm}) - accumulate_s, w.expert_flops, fp8, w.rows_per_expert, "FLOP", ref,
                     accumulate_note(accumulate_s)));
  // The dense group also holds the products that stay BF16 (router, LM head): the model prices
  // them at the BF16 curve, so the FP8 products get what is left.
  const double dense_s = seconds_of(ref, {G::DenseGemm});
  const double bf16_s = (w.dense_flops - w.fp8_dense_flops) / (bf16 * p.gemm_dense_bf16.at(ref.d_model));
  MOE_CHECK(dense_s > bf16_s, "fitting gemm_dense_fp8 to ", ref.name, ": its dense GEMMs took ", 1e3 * dense_s,
            " ms per step, no longer than its BF16 products alone would at the BF16 step's rate (", 1e3 * bf16_s,
            " ms): time the BF16 and FP8 steps on the same GPU in the same call");
  char less[160];
  std::snprintf(less, sizeof less, " (the group's %.2f ms less %.2f ms of BF16 products at the gemm_dense_bf16 curve)",
                1e3 * dense_s, 1e3 * bf16_s);
  fits.push_back(fit(p.gemm_dense_fp8, "gemm_dense_fp8", {G::DenseGemm}, dense_s - bf16_s, w.fp8_dense_flops, fp8,
                     ref.d_model, "FLOP", ref, less));
  return fits;
}

}  // namespace moe

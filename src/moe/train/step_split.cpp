#include "moe/train/step_split.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "moe/core/device.h"
#include "moe/core/error.h"

#if defined(MOE_HAVE_CUDA)
#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"
#include "moe/core/gpu_timer.h"
#include "moe/ops/fp8.h"
#include "moe/ops/gemm.h"
#endif

namespace moe {

namespace {

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}


}  // namespace

Ceilings measure_ceilings(bool fp8) {
  Ceilings c;
#if defined(MOE_HAVE_CUDA)
  if (std::string why; !cuda_available(&why)) {
    c.why_not = why;
    return c;
  }
  constexpr int64_t kEdge = 8192;
  constexpr size_t kCopyBytes = size_t{1} << 30;
  const size_t gemm_bytes = static_cast<size_t>(kEdge * kEdge) * 2;
  void* buf = nullptr;
  if (cudaMalloc(&buf, 3 * gemm_bytes + 2 * kCopyBytes) != cudaSuccess) {
    cudaGetLastError();  // clear the allocation error
    c.why_not = "no room for the 2.4 GiB the measurement needs";
    return c;
  }
  const std::unique_ptr<void, cudaError_t (*)(void*)> freed_on_exit(buf, cudaFree);  // also when a call throws
  char* base = static_cast<char*>(buf);
  CUDA_CHECK(cudaMemsetAsync(buf, 0, 3 * gemm_bytes + 2 * kCopyBytes, compute_stream()));
  const Tensor a(base, DType::BF16, {kEdge, kEdge}, Device::CUDA);
  const Tensor b(base + gemm_bytes, DType::BF16, {kEdge, kEdge}, Device::CUDA);
  const Tensor out(base + 2 * gemm_bytes, DType::BF16, {kEdge, kEdge}, Device::CUDA);
  // As many warm-up calls as timed ones: the clocks settle (one warm-up call left the GEMM
  // ceiling 10-20% low in some runs).
  const double gemm_ms = time_gpu(20, 20, [&] { matmul(out, a, b, false, true, 1.0f, 0.0f); }).median_ms;
  c.gemm_tflops = 2.0 * kEdge * kEdge * kEdge / (gemm_ms * 1e-3) / 1e12;
  char* src = base + 3 * gemm_bytes;
  char* dst = src + kCopyBytes;
  const double copy_ms = time_gpu(20, 20, [&] {
                            CUDA_CHECK(cudaMemcpyAsync(dst, src, kCopyBytes, cudaMemcpyDeviceToDevice, compute_stream()));
                          }).median_ms;
  c.copy_tb_s = 2.0 * static_cast<double>(kCopyBytes) / (copy_ms * 1e-3) / 1e12;
  if (fp8 && current_gpu().major == 9) {
    // The same 8192^3 product in FP8 (codes in the BF16 operands' bytes, scales after the codes):
    // a with 1x128 tiles, b with 128x128 blocks, BF16 out, as the model's forward products.
    const Shape square{kEdge, kEdge};
    const Shape a_scales = fp8_scale_shape(square, Fp8Tiles::Rows), b_scales = fp8_scale_shape(square, Fp8Tiles::Blocks);
    char* codes = base;  // within the BF16 a and b buffers: 2 x kEdge^2 bytes, then the scales
    const Fp8Tensor fa{Tensor(codes, DType::FP8_E4M3, square, Device::CUDA),
                       Tensor(codes + 2 * kEdge * kEdge, DType::F32, a_scales, Device::CUDA), Fp8Tiles::Rows};
    const Fp8Tensor fb{Tensor(codes + kEdge * kEdge, DType::FP8_E4M3, square, Device::CUDA),
                       Tensor(codes + 2 * kEdge * kEdge + 4 * a_scales.numel(), DType::F32, b_scales, Device::CUDA),
                       Fp8Tiles::Blocks};
    const double fp8_ms = time_gpu(20, 20, [&] { fp8_matmul(out, fa, fb, false); }).median_ms;
    c.fp8_gemm_tflops = 2.0 * kEdge * kEdge * kEdge / (fp8_ms * 1e-3) / 1e12;
  }
#else
  (void)fp8;
  c.why_not = "this build has no CUDA backend";
#endif
  return c;
}

const char* kernel_group_name(KernelGroup g) {
  switch (g) {
    case KernelGroup::ExpertGemm: return "expert GEMMs";
    case KernelGroup::DenseGemm: return "dense GEMMs";
    case KernelGroup::Attention: return "attention";
    case KernelGroup::Fp8Quantize: return "FP8 quantize";
    case KernelGroup::Fp8Cache: return "FP8 cache";
    case KernelGroup::AdamW: return "AdamW update";
    case KernelGroup::GradNorm: return "gradient norm";
    case KernelGroup::Other: return "other";
  }
  return "?";
}

KernelGroup kernel_group(std::string_view name) {
  std::string n(name);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  // Order matters: CUTLASS kernel names also contain "gemm"; the zeroing kernel of empty experts
  // lives in the CUTLASS wrapper's namespace but moves bytes, not FLOPs.
  // The AdamW update that writes the FP8 caches in its pass (adamw_quantize_blocks_kernel) is AdamW.
  if (contains(n, "adamw")) return KernelGroup::AdamW;
  if (contains(n, "quantize_blocks")) return KernelGroup::Fp8Cache;
  if (contains(n, "quantize_rows") || contains(n, "quantize_columns") || contains(n, "stage_scales"))
    return KernelGroup::Fp8Quantize;
  if (contains(n, "cutlass") && !contains(n, "zero_empty") && !contains(n, "zero_skipped")) return KernelGroup::ExpertGemm;
  if (contains(n, "sm90_fp8")) return KernelGroup::ExpertGemm;  // our own FP8 expert kernel (fp8_grouped_gemm_sm90.h)
  if (contains(n, "sum_squares")) return KernelGroup::GradNorm;
  if (contains(n, "cudnn") || contains(n, "sdpa") || contains(n, "fmha") || contains(n, "flash"))
    return KernelGroup::Attention;
  if (contains(n, "nvjet") || contains(n, "gemm") || contains(n, "xmma") || contains(n, "cublas"))
    return KernelGroup::DenseGemm;
  return KernelGroup::Other;
}

std::vector<SplitRow> split_step(const std::vector<KernelProfiler::Entry>& entries, int steps, const StepWork& work,
                                 const Ceilings& ceilings) {
  MOE_CHECK(steps >= 1, "split_step: steps = ", steps, ", expected at least 1");
  constexpr int kGroups = static_cast<int>(KernelGroup::Other) + 1;
  double ms[kGroups] = {};
  double total = 0;
  for (const auto& e : entries) {
    ms[static_cast<int>(kernel_group(e.name))] += e.total_ms / steps;
    total += e.total_ms / steps;
  }
  std::vector<SplitRow> rows;
  for (int g = 0; g < kGroups; ++g) {
    if (ms[g] <= 0) continue;
    SplitRow r;
    r.group = static_cast<KernelGroup>(g);
    r.ms_per_step = ms[g];
    r.share = total > 0 ? ms[g] / total : 0;
    double amount = 0;  // FLOPs or bytes per step
    bool bytes = true;
    switch (r.group) {
      case KernelGroup::ExpertGemm: amount = work.expert_flops, bytes = false; break;
      case KernelGroup::DenseGemm: amount = work.dense_flops, bytes = false; break;
      case KernelGroup::Attention: amount = work.attention_flops, bytes = false; break;
      case KernelGroup::Fp8Quantize: amount = work.fp8_quantize_bytes; break;
      case KernelGroup::Fp8Cache: amount = work.fp8_cache_bytes; break;
      case KernelGroup::AdamW:
        amount = work.adamw_bytes;
        // The FP8 caches written inside the pass: their share of its time, by their share of its bytes.
        if (work.adamw_bytes > 0) r.fp8_cache_ms = ms[g] * work.fp8_cache_in_adamw_bytes / work.adamw_bytes;
        break;
      case KernelGroup::GradNorm: amount = work.grad_norm_bytes; break;
      case KernelGroup::Other: amount = work.elementwise_bytes + work.optimizer_other_bytes; break;
    }
    if (amount > 0) {
      r.rate = amount / (ms[g] * 1e-3) / 1e12;
      r.unit = bytes ? "TB/s" : "TFLOP/s";
      // Attention stays BF16 in FP8 runs: its ceiling is the BF16 GEMM's.
      const bool fp8_row = ceilings.fp8_gemm_tflops > 0 && r.group != KernelGroup::Attention;
      r.ceiling = bytes ? ceilings.copy_tb_s : fp8_row ? ceilings.fp8_gemm_tflops : ceilings.gemm_tflops;
    }
    rows.push_back(r);
  }
  return rows;
}

namespace {
std::string fp8_ceiling(const Ceilings& c) {
  if (c.fp8_gemm_tflops <= 0) return "";
  char s[96];
  std::snprintf(s, sizeof(s), " FP8 GEMM 8192^3 %.0f TFLOP/s (the expert and dense GEMM rows' ceiling),",
                c.fp8_gemm_tflops);
  return s;
}
}  // namespace

std::string format_step_split(const std::vector<SplitRow>& rows, const Ceilings& ceilings) {
  std::string out;
  char line[256];
  if (ceilings.gemm_tflops > 0)
    std::snprintf(line, sizeof(line),
                  "  step-time split by kind (GPU time per step); ceilings measured now: BF16 GEMM 8192^3 %.0f "
                  "TFLOP/s,%s device copy %.2f TB/s\n",
                  ceilings.gemm_tflops, fp8_ceiling(ceilings).c_str(), ceilings.copy_tb_s);
  else
    std::snprintf(line, sizeof(line), "  step-time split by kind (GPU time per step); ceilings not measured (%s)\n",
                  ceilings.why_not.c_str());
  out += line;
  for (const SplitRow& r : rows) {
    int n = std::snprintf(line, sizeof(line), "    %-14s %9.2f ms %6.1f%%", kernel_group_name(r.group), r.ms_per_step,
                          100 * r.share);
    if (r.rate > 0 && r.ceiling > 0)
      n += std::snprintf(line + n, sizeof(line) - static_cast<size_t>(n), "   %7.2f %-7s = %3.0f%% of the ceiling",
                         r.rate, r.unit, 100 * r.rate / r.ceiling);
    else if (r.rate > 0)
      n += std::snprintf(line + n, sizeof(line) - static_cast<size_t>(n), "   %7.2f %s", r.rate, r.unit);
    if (r.group == KernelGroup::Attention)
      std::snprintf(line + n, sizeof(line) - static_cast<size_t>(n), " (full-square FLOPs; causal runs ~half)");
    else if (r.group == KernelGroup::Fp8Quantize)
      std::snprintf(line + n, sizeof(line) - static_cast<size_t>(n), " (with the SwiGLU forwards that quantize)");
    else if (r.group == KernelGroup::Other)
      std::snprintf(line + n, sizeof(line) - static_cast<size_t>(n), " (element-wise, norms, routing, loss)");
    else if (r.group == KernelGroup::AdamW && r.fp8_cache_ms > 0)
      std::snprintf(line + n, sizeof(line) - static_cast<size_t>(n),
                    " (of which writing the FP8 caches ~%.2f ms, by their share of the bytes)", r.fp8_cache_ms);
    out += line;
    out += '\n';
  }
  return out;
}

}  // namespace moe

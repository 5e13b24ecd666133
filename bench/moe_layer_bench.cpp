// moe_layer_bench: one MoE layer's forward + backward on the GPU, the moetrain ops the model runs
// (router product and top-K, route index, row gather, CUTLASS grouped SwiGLU experts, weighted
// combine, and their backward, with the weight gradients), timed with CUDA events. The same
// work as python/bench/torch_olmoe.py --moe-layer-only (issue 6's MoE-layer benchmark): BF16
// activations and weights, FP32 router logits, dropless, no auxiliary losses; expert
// TFLOP/s counts 6 x T x K x 3 x d x h.
#include <CLI/CLI.hpp>
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <vector>

#include "moe/core/arena.h"
#include "moe/core/cuda_check.h"
#include "moe/core/device.h"
#include "moe/core/gpu_timer.h"
#include "moe/core/kernel_profiler.h"
#include "moe/ops/activation.h"
#include "moe/ops/elementwise.h"
#include "moe/ops/gemm.h"
#include "moe/ops/grouped_gemm.h"
#include "moe/ops/permute.h"
#include "moe/ops/route.h"
#include "moe/ops/router.h"

namespace {

using namespace moe;

void fill_random(const Tensor& t, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> host(static_cast<size_t>(t.numel()));
  for (float& v : host) v = normal(rng);
  if (t.dtype == DType::F32) return copy_to_tensor(t, host.data());
  Arena staging("staging", Device::CUDA);
  const auto s = staging.reserve("f32", DType::F32, t.shape);
  staging.commit();
  copy_to_tensor(staging.get(s), host.data());
  cast_copy(t, staging.get(s));
  device_synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t T = 32768, d = 2048, h = 1024, N = 64, K = 4;
  int iters = 20, warmup = 5;
  bool profile = false;
  CLI::App app{"moe_layer_bench: one MoE layer forward + backward on the GPU"};
  app.add_option("--tokens", T)->capture_default_str();
  app.add_option("--d-model", d)->capture_default_str();
  app.add_option("--expert-hidden", h)->capture_default_str();
  app.add_option("--experts", N)->capture_default_str();
  app.add_option("--topk", K)->capture_default_str();
  app.add_option("--iters", iters)->capture_default_str();
  app.add_option("--warmup", warmup)->capture_default_str();
  app.add_flag("--profile", profile, "after timing, run --iters more layers under CUPTI and print the kernel table");
  CLI11_PARSE(app, argc, argv);
  try {
    std::string why;
    MOE_CHECK(cuda_available(&why), "moe_layer_bench needs a GPU: ", why);
    const int64_t R = T * K;  // dropless: every route keeps its row
    const auto B = DType::BF16, F = DType::F32, I = DType::I32;
    Arena a("moe layer", Device::CUDA);
    const auto x_ = a.reserve("x", B, {T, d}), gy_ = a.reserve("dy", B, {T, d}), dx_ = a.reserve("dx", B, {T, d});
    const auto wr_ = a.reserve("router", B, {N, d}), w13_ = a.reserve("w13", B, {N, 2 * h, d});
    const auto w2_ = a.reserve("w2", B, {N, d, h});
    const auto gwr_ = a.reserve("g_router", F, {N, d}), gw13_ = a.reserve("g_w13", F, {N, 2 * h, d});
    const auto gw2_ = a.reserve("g_w2", F, {N, d, h});
    const auto logits_ = a.reserve("logits", F, {T, N}), scores_ = a.reserve("scores", F, {T, N});
    const auto dlogits_ = a.reserve("dlogits", F, {T, N}), dlogits_b_ = a.reserve("dlogits_bf16", B, {T, N});
    const auto idx_ = a.reserve("topk_idx", I, {T, K}), w_ = a.reserve("topk_w", F, {T, K});
    const auto dw_ = a.reserve("dtopk_w", F, {T, K}), counts_ = a.reserve("counts", I, {N});
    const auto route_ = a.reserve("route_index", I, {R}), offs_ = a.reserve("offsets", I, {N + 1});
    const auto xe_ = a.reserve("xe", B, {R, d}), gu_ = a.reserve("gu", B, {R, 2 * h}), act_ = a.reserve("act", B, {R, h});
    const auto ye_ = a.reserve("ye", B, {R, d}), out_ = a.reserve("out", B, {T, d});
    const auto dye_ = a.reserve("dye", B, {R, d}), dact_ = a.reserve("dact", B, {R, h});
    const auto dgu_ = a.reserve("dgu", B, {R, 2 * h}), dxe_ = a.reserve("dxe", B, {R, d});
    a.commit();
    auto t = [&](Arena::Slot s) { return a.get(s); };
    fill_random(t(x_), 1.0f, 1);
    fill_random(t(gy_), 1.0f, 2);
    fill_random(t(wr_), 0.02f, 3);
    fill_random(t(w13_), 0.02f, 4);
    fill_random(t(w2_), 0.02f, 5);

    auto once = [&] {
      // forward
      matmul(t(logits_), t(x_), t(wr_), false, true, 1.0f, 0.0f);
      router_forward(t(scores_), t(idx_), t(w_), t(logits_), Tensor(), ScoreFn::Softmax, false);
      route_counts(t(counts_), t(idx_));
      route_index_local(t(route_), t(offs_), t(idx_), t(counts_), R);
      scatter_rows_to_routes(t(xe_), t(x_), t(route_), static_cast<int>(K));
      grouped_matmul(t(gu_), t(xe_), t(w13_), t(offs_), true, false);
      swiglu_forward(t(act_), t(gu_));
      grouped_matmul(t(ye_), t(act_), t(w2_), t(offs_), true, false);
      combine_rows(t(out_), t(ye_), t(w_), t(route_), static_cast<int>(K), false);
      // backward (dy given); the expert weight gradients are written, as in the first microbatch of a
      // training step (and as the PyTorch layer, which makes fresh gradients every iteration)
      combine_rows_backward(t(dye_), t(dw_), t(gy_), t(ye_), t(w_), t(route_), static_cast<int>(K));
      grouped_matmul(t(dact_), t(dye_), t(w2_), t(offs_), false, false);
      grouped_matmul_wgrad(t(gw2_), t(dye_), t(act_), t(offs_), {}, /*accumulate=*/false);
      swiglu_backward(t(dgu_), t(dact_), t(gu_));
      grouped_matmul(t(dxe_), t(dgu_), t(w13_), t(offs_), false, false);
      grouped_matmul_wgrad(t(gw13_), t(dgu_), t(xe_), t(offs_), {}, /*accumulate=*/false);
      scatter_rows_to_routes_backward(t(dx_), t(dxe_), t(route_), static_cast<int>(K), false);
      router_backward(t(dlogits_), t(dw_), t(idx_), t(w_), t(scores_), t(logits_), t(counts_), 0.0f, 0.0f,
                      ScoreFn::Softmax, false);
      cast_copy(t(dlogits_b_), t(dlogits_));
      matmul(t(dx_), t(dlogits_b_), t(wr_), false, false, 1.0f, 1.0f);
      matmul(t(gwr_), t(dlogits_b_), t(x_), true, false, 1.0f, 1.0f);
    };
    const GpuTimes times = time_gpu(warmup, iters, once);
    const double median = times.median_ms;
    const double tflops = 6.0 * static_cast<double>(T * K) * 3.0 * static_cast<double>(d * h) / (median * 1e-3) / 1e12;
    std::printf("moetrain MoE layer fwd+bwd: T %ld d %ld h %ld N %ld top-%ld: median %.3f ms (min %.3f, max %.3f) over "
                "%d; expert GEMMs %.0f TFLOP/s\n",
                static_cast<long>(T), static_cast<long>(d), static_cast<long>(h), static_cast<long>(N),
                static_cast<long>(K), median, times.min_ms, times.max_ms, iters, tflops);
    if (profile) {  // a separate window: CUPTI's per-launch cost stays out of the timing above
      KernelProfiler profiler;
      MOE_CHECK(profiler.available(), "--profile: ", profiler.why());
      profiler.start();
      for (int i = 0; i < iters; ++i) once();
      profiler.stop();
      std::printf("%s", format_kernel_table(profiler.top(25), profiler.total_ms(), iters).c_str());
    }
    std::printf("RESULT_JSON {\"bench\": \"moetrain_moe_layer\", \"experts\": %ld, \"topk\": %ld, \"tokens\": %ld, "
                "\"ms\": %.3f, \"expert_tflops\": %.1f}\n",
                static_cast<long>(N), static_cast<long>(K), static_cast<long>(T), median, tflops);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

#include "moe/perf/calibrate.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ctime>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "moe/core/error.h"

#if defined(MOE_HAVE_CUDA)
#include "moe/comm/host_strings.h"
#include "moe/comm/nccl_communicator.h"
#include "moe/core/arena.h"
#include "moe/core/device.h"
#include "moe/core/gpu_timer.h"
#include "moe/core/host_name.h"
#include "moe/core/rng.h"
#include "moe/ops/activation.h"
#include "moe/ops/attention.h"
#include "moe/ops/elementwise.h"
#include "moe/ops/fp8.h"
#include "moe/ops/gemm.h"
#include "moe/ops/grouped_gemm.h"
#include "moe/ops/norm.h"
#include "moe/parallel/dispatch_timing.h"
#include "moe/perf/step_fit.h"
#include "moe/perf/step_model.h"
#include "moe/train/builtin_configs.h"
#include "moe/train/config.h"
#include "moe/train/step_split.h"
#include "moe/train/step_work.h"
#include "moe/train/trainer.h"
#endif

namespace moe {

#if defined(MOE_HAVE_CUDA)
namespace {

constexpr int kWarmup = 10, kIters = 20;
constexpr double kTera = 1e12, kMiB = 1 << 20;

// Small random BF16 values (zeros would let the GPU draw less power and clock higher than in training).
void fill_random(const Tensor& t, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint16_t> host(static_cast<size_t>(t.numel()));
  for (uint16_t& v : host) {
    const float x = static_cast<float>(rng.uniform() * 2 - 1);
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    v = static_cast<uint16_t>(bits >> 16);
  }
  copy_to_tensor(t, host.data());
}

void say(Communicator& world, const char* what, double x, double value, const char* unit, double eff) {
  if (world.rank() == 0)
    std::printf("  %-34s x = %-12.0f %9.1f %-8s = %5.1f%% of the peak\n", what, x, value, unit, 100 * eff);
}

// Dense BF16 products x[M, d] W[d, d]^T, the shape of the attention projections.
void measure_dense(HardwareProfile& p, const Ceilings& ceil, Communicator& world) {
  constexpr int64_t M = 16384;
  std::vector<std::pair<double, double>> points;
  for (int64_t d : {1024, 2048, 4096}) {
    Arena a("calibrate.dense", Device::CUDA);
    const auto xs = a.reserve("x", DType::BF16, {M, d}), ws = a.reserve("w", DType::BF16, {d, d});
    const auto ys = a.reserve("y", DType::BF16, {M, d});
    a.commit();
    fill_random(a.get(xs), 1), fill_random(a.get(ws), 2);
    const double ms = time_gpu(kWarmup, kIters, [&] { matmul(a.get(ys), a.get(xs), a.get(ws), false, true, 1, 0); }).median_ms;
    const double eff = 2.0 * M * d * d / (ms * 1e-3) / (p.peak_bf16_tflops * kTera);
    say(world, "dense BF16 GEMM, d_model", static_cast<double>(d), eff * p.peak_bf16_tflops, "TFLOP/s", eff);
    points.emplace_back(static_cast<double>(d), eff);
  }
  points.emplace_back(8192, ceil.gemm_tflops / p.peak_bf16_tflops);
  say(world, "dense BF16 GEMM 8192^3", 8192, ceil.gemm_tflops, "TFLOP/s", points.back().second);
  p.gemm_dense_bf16.set_points(points, "cuBLASLt x[16384, d] W[d, d]^T and the 8192^3 ceiling, alone");
  if (ceil.fp8_gemm_tflops > 0) {
    p.gemm_dense_fp8.set_points({{8192, ceil.fp8_gemm_tflops / p.peak_fp8_tflops}}, "cuBLASLt block-scaled FP8 8192^3, alone");
    say(world, "dense FP8 GEMM 8192^3", 8192, ceil.fp8_gemm_tflops, "TFLOP/s", p.gemm_dense_fp8.points[0].second);
  }
}

// The routed experts' gate/up product (d 2048 -> 2h 2048): forward, data gradient, weight gradient.
void measure_grouped(HardwareProfile& p, Communicator& world) {
  constexpr int64_t d = 2048, out = 2048;
  std::vector<std::pair<double, double>> points;
  for (auto [rows, experts] : {std::pair<int64_t, int64_t>{32768, 128}, {131072, 128}, {131072, 32}, {131072, 8}}) {
    Arena a("calibrate.grouped", Device::CUDA);
    const auto xs = a.reserve("x", DType::BF16, {rows, d}), ws = a.reserve("w", DType::BF16, {experts, out, d});
    const auto ys = a.reserve("y", DType::BF16, {rows, out}), dxs = a.reserve("dx", DType::BF16, {rows, d});
    const auto dws = a.reserve("dw", DType::F32, {experts, out, d});
    const auto offs = a.reserve("offsets", DType::I32, {experts + 1});
    a.commit();
    fill_random(a.get(xs), 3), fill_random(a.get(ws), 4), fill_random(a.get(ys), 5);
    std::vector<int32_t> offsets;
    for (int64_t e = 0; e <= experts; ++e) offsets.push_back(static_cast<int32_t>(e * rows / experts));
    copy_to_tensor(a.get(offs), offsets.data());
    const Tensor x = a.get(xs), w = a.get(ws), y = a.get(ys), dx = a.get(dxs), dw = a.get(dws), o = a.get(offs);
    const double ms = time_gpu(kWarmup, kIters, [&] {
                        grouped_matmul(y, x, w, o, /*trans_b=*/true, /*accumulate=*/false);
                        grouped_matmul(dx, y, w, o, /*trans_b=*/false, /*accumulate=*/false);
                        grouped_matmul_wgrad(dw, y, x, o, {}, /*accumulate=*/false);
                      }).median_ms;
    const double rows_per_expert = static_cast<double>(rows / experts);
    const double eff = 3 * 2.0 * rows * d * out / (ms * 1e-3) / (p.peak_bf16_tflops * kTera);
    say(world, "grouped BF16 GEMM, rows per expert", rows_per_expert, eff * p.peak_bf16_tflops, "TFLOP/s", eff);
    points.emplace_back(rows_per_expert, eff);
  }
  std::sort(points.begin(), points.end());
  p.gemm_grouped_bf16.set_points(points, "CUTLASS grouped gate/up product 2048 -> 2048: forward, data gradient, weight "
                                         "gradient (F32, written), alone");
}

// cuDNN SDPA forward + backward at the MFU's full-square FLOP count.
void measure_attention(HardwareProfile& p, Communicator& world) {
  constexpr int64_t tokens = 32768, heads = 16, hd = 128, width = heads * hd;
  std::vector<std::pair<double, double>> points;
  for (int64_t seq : {2048, 4096, 8192}) {
    const AttentionShape s{tokens / seq, seq, heads, heads, hd};
    Arena a("calibrate.attention", Device::CUDA);
    std::vector<Arena::Slot> bufs;
    for (const char* n : {"q", "k", "v", "out", "dout", "dq", "dk", "dv"})
      bufs.push_back(a.reserve(n, DType::BF16, {tokens, width}));
    const auto lse = a.reserve("lse", DType::F32, {tokens / seq, heads, seq});
    const auto ws = a.reserve("workspace", DType::F32, {std::max<int64_t>(1, attention_workspace_elems(s))});
    a.commit();
    for (size_t i = 0; i < 5; ++i) fill_random(a.get(bufs[i]), 10 + i);
    auto t = [&](int i) { return a.get(bufs[static_cast<size_t>(i)]); };
    const double ms = time_gpu(kWarmup, kIters, [&] {
                        attention_forward(t(3), a.get(lse), t(0), t(1), t(2), s, a.get(ws));
                        attention_backward(t(5), t(6), t(7), t(4), t(0), t(1), t(2), t(3), a.get(lse), s, a.get(ws));
                      }).median_ms;
    const double eff = 12.0 * seq * width * tokens / (ms * 1e-3) / (p.peak_bf16_tflops * kTera);
    say(world, "attention fwd+bwd, seq_len", static_cast<double>(seq), eff * p.peak_bf16_tflops, "TFLOP/s", eff);
    points.emplace_back(static_cast<double>(seq), eff);
  }
  p.attention.set_points(points, "cuDNN SDPA forward + backward, 32768 tokens, 16 heads of 128, full-square FLOPs, "
                                 "alone");
}

// Element-wise kernels at OLMoE sizes (their bytes as step_work.h counts them), FP8 row quantization.
void measure_memory_bound(HardwareProfile& p, const Ceilings& ceil, Communicator& world) {
  constexpr int64_t M = 32768, d = 2048, R = 131072, h = 1024;
  const double mem = p.memory_tb_s * kTera;
  {
    Arena a("calibrate.elementwise", Device::CUDA);
    const auto xs = a.reserve("x", DType::BF16, {M, d}), ys = a.reserve("y", DType::BF16, {M, d});
    const auto rs = a.reserve("rstd", DType::F32, {M}), ws = a.reserve("weight", DType::BF16, {d});
    const auto gus = a.reserve("gate_up", DType::BF16, {R, 2 * h}), acts = a.reserve("act", DType::BF16, {R, h});
    const auto dgus = a.reserve("dgate_up", DType::BF16, {R, 2 * h});
    a.commit();
    fill_random(a.get(xs), 20), fill_random(a.get(ws), 21), fill_random(a.get(gus), 22);
    const double ms = time_gpu(kWarmup, kIters, [&] {
                        rmsnorm_forward(a.get(ys), a.get(rs), a.get(xs), a.get(ws), 1e-5f);
                        swiglu_forward(a.get(acts), a.get(gus));
                        swiglu_backward(a.get(dgus), a.get(acts), a.get(gus));
                      }).median_ms;
    const double bytes = 2.0 * (2 * M * d + 3 * R * h + 5 * R * h);
    const double eff = bytes / (ms * 1e-3) / mem;
    say(world, "RMSNorm + SwiGLU fwd/bwd, bytes", bytes, bytes / (ms * 1e-3) / 1e9, "GB/s", eff);
    p.elementwise.set_points({{bytes, eff}}, "RMSNorm forward [32768, 2048], SwiGLU forward and backward [131072, 2048], "
                                             "alone");
  }
  if (ceil.fp8_gemm_tflops > 0) {
    Arena a("calibrate.fp8", Device::CUDA);
    const Shape shape{M, d};
    const auto xs = a.reserve("x", DType::BF16, shape), cs = a.reserve("codes", DType::FP8_E4M3, shape);
    const auto ss = a.reserve("scales", DType::F32, fp8_scale_shape(shape, Fp8Tiles::Rows));
    a.commit();
    fill_random(a.get(xs), 23);
    const Fp8Tensor q{a.get(cs), a.get(ss), Fp8Tiles::Rows};
    const double ms = time_gpu(kWarmup, kIters, [&] { fp8_quantize_rows(q, a.get(xs)); }).median_ms;
    const double bytes = 3.0 * M * d;
    const double eff = bytes / (ms * 1e-3) / mem;
    say(world, "FP8 quantize rows, bytes", bytes, bytes / (ms * 1e-3) / 1e9, "GB/s", eff);
    p.fp8_quantize.set_points({{bytes, eff}}, "FP8 row quantization of [32768, 2048] BF16, alone");
  }
  p.optimizer.set_points({{1e9, ceil.copy_tb_s / p.memory_tb_s}}, "device-to-device copy of 1 GiB (AdamW runs near it), "
                                                                  "alone");
  say(world, "device copy (optimizer), bytes", 2.0 * (1 << 30), ceil.copy_tb_s * 1e3, "GB/s", p.optimizer.points[0].second);
}

// Steps of the reference model timed per precision: the first is not profiled (it builds the
// cuBLASLt and cuDNN plans), the second captures the CUDA graph that the others replay.
constexpr int kReferenceSteps = 8;

// kReferenceSteps training steps of the built-in bench-olmoe-4l in `precision` on this rank's GPU
// alone (as `moetrain bench --config configs/bench-olmoe-4l.toml --set train.cuda_graph=true`), the
// kernel profiler recording all steps but the first: their split and work. Prints the split and
// the measured step time on rank 0.
ReferenceStep time_reference_step(Communicator& world, const char* precision, const Ceilings& ceil) {
  const Config cfg = parse_config(builtin::kBenchOlmoe4lToml, "built-in config 'bench-olmoe-4l'",
                                  {"train.steps=" + std::to_string(kReferenceSteps), "train.cuda_graph=true",
                                   std::string("train.precision=\"") + precision + "\""});
  const std::unique_ptr<Communicator> alone = world.split(world.rank(), 0);  // one step per GPU, no collectives
  KernelProfiler profiler;
  MOE_CHECK(profiler.available(), "bench --calibrate times a training step with the kernel profiler, which is not "
            "available: ", profiler.why());
  TrainOptions opts;
  opts.bench = true, opts.quiet = true, opts.profiler = &profiler;
  ReferenceStep ref;
  ref.work = step_work(cfg, rank_layout(cfg, 1));
  ref.d_model = static_cast<double>(cfg.model.hidden_size);
  ref.seq_len = static_cast<double>(cfg.train.seq_len);
  double step_s = 0;
  int timed = 0;
  try {
    Trainer trainer(cfg, opts, *alone);
    const TrainSummary s = trainer.run();
    timed = static_cast<int>(s.steps.size()) - 1;
    MOE_CHECK(timed >= 1, "bench --calibrate: the reference step ran ", s.steps.size(), " steps, expected ",
              kReferenceSteps);
    step_s = s.mean_step_time_s;
    ref.split = split_step(profiler.top(SIZE_MAX), timed, ref.work, ceil);
  } catch (const AgreedError& e) {
    // Agreed over this rank alone, not the job: the other ranks may not meet it (a GPU with less
    // free memory), so it ends the job as any one rank's error does.
    throw Error(e.what());
  }  // the trainer's memory is free again
  ref.name = std::string("bench-olmoe-4l ") + precision + " (" + std::to_string(timed) + " profiled steps)";
  if (world.rank() == 0) {
    double gpu_ms = 0;
    for (const SplitRow& r : ref.split) gpu_ms += r.ms_per_step;
    std::printf("  %s: %.4f s per step, %.2f ms of GPU time\n%s", ref.name.c_str(), step_s, gpu_ms,
                format_step_split(ref.split, ceil).c_str());
  }
  return ref;
}

void say_fits(Communicator& world, const std::vector<InStepFit>& fits) {
  if (world.rank() != 0) return;
  for (const InStepFit& f : fits)
    std::printf("  in the step: %-18s %-30s %8.2f ms = %5.1f%% of the peak (alone %5.1f%%): factor %.3f\n",
                f.curve.c_str(), f.groups.c_str(), f.ms, 100 * f.efficiency, 100 * f.alone, f.factor);
}

// Fits the in-step factors (step_fit.h) to a BF16 reference step and, on Hopper, an FP8 one; says
// what the fitted profile predicts for each.
void fit_to_reference_steps(HardwareProfile& p, const Ceilings& ceil, Communicator& world) {
  std::vector<std::pair<const char*, ReferenceStep>> steps;
  steps.emplace_back("bf16", time_reference_step(world, "bf16", ceil));
  say_fits(world, fit_bf16_step(p, steps.back().second));
  if (ceil.fp8_gemm_tflops > 0) {  // FP8 runs on Hopper only
    steps.emplace_back("fp8", time_reference_step(world, "fp8", ceil));
    say_fits(world, fit_fp8_step(p, steps.back().second));
  }
  if (world.rank() != 0) return;
  for (const auto& [precision, ref] : steps) {
    const Config cfg = parse_config(builtin::kBenchOlmoe4lToml, "built-in config 'bench-olmoe-4l'",
                                    {std::string("train.precision=\"") + precision + "\""});
    Topology one;
    one.layout = rank_layout(cfg, 1);
    double gpu_ms = 0;
    for (const SplitRow& r : ref.split) gpu_ms += r.ms_per_step;
    std::printf("  the fitted profile predicts %.4f s per step for %s (its GPU time: %.4f s)\n",
                predict_step(cfg, one, p).step_s, ref.name.c_str(), gpu_ms * 1e-3);
  }
}

// NCCL reduce-scatter and all-gather by message size; rowwise dispatch and combine.
void measure_links(HardwareProfile& p, Communicator& world) {
  std::string why;
  MOE_CHECK(nccl_available(&why), "bench --calibrate on ", world.size(), " ranks measures the links with NCCL: ", why);
  const std::vector<std::string> hosts = all_gather_strings(world, host_name());
  const bool across = std::set<std::string>(hosts.begin(), hosts.end()).size() > 1;
  const std::unique_ptr<Communicator> nccl = make_nccl_communicator(world);
  const int64_t n = nccl->size();
  const double link = (across ? p.inter_node_gb_s : p.intra_node_gb_s) * 1e9;
  std::vector<std::pair<double, double>> points;
  for (double mib : {1.0, 4.0, 16.0, 64.0, 256.0, 1024.0}) {
    const int64_t elems = static_cast<int64_t>(mib * kMiB / 4) / n * n;
    Arena a("calibrate.collectives", Device::CUDA);
    const auto full = a.reserve("full", DType::F32, {elems}), shard = a.reserve("shard", DType::F32, {elems / n});
    a.commit();
    fill_zero(a.get(full)), fill_zero(a.get(shard));
    nccl->barrier();
    const double rs_ms = time_gpu(kWarmup, kIters, [&] { nccl->reduce_scatter(a.get(shard), a.get(full), ReduceOp::Sum); }).median_ms;
    const double ag_ms = time_gpu(kWarmup, kIters, [&] { nccl->all_gather(a.get(full), a.get(shard)); }).median_ms;
    const double bytes = 4.0 * static_cast<double>(elems);
    const double bus = bytes * static_cast<double>(n - 1) / static_cast<double>(n) / ((rs_ms + ag_ms) / 2 * 1e-3);
    say(world, "NCCL reduce-scatter + all-gather", bytes, bus / 1e9, "GB/s bus", bus / link);
    points.emplace_back(bytes, bus / link);
  }
  EfficiencyCurve& curve = across ? p.collective_inter : p.collective_intra;
  curve.set_points(points, "NCCL reduce-scatter and all-gather of F32 buffers on " + std::to_string(n) + " ranks" +
                               (across ? " across hosts" : " of one host") + ", bus bandwidth over the link bandwidth");
  if (across) return;  // EP groups stay inside one node
  std::vector<std::pair<double, double>> dispatch;
  for (int64_t tokens : {2048, 16384}) {
    DispatchTimingShape s;
    s.tokens = tokens, s.hidden = 4096, s.top_k = 4, s.experts_per_rank = 8;
    const DispatchTimes t = time_rowwise_dispatch(*nccl, s, kWarmup, kIters);
    const double crossing = t.payload_bytes * static_cast<double>(n - 1) / static_cast<double>(n);
    const double rate = crossing / ((t.dispatch_ms + t.combine_ms) / 2 * 1e-3);
    say(world, "rowwise dispatch + combine", crossing, rate / 1e9, "GB/s", rate / link);
    dispatch.emplace_back(crossing, rate / link);
  }
  p.dispatch_intra.set_points(dispatch, "rowwise dispatch and combine (dispatch_timing.h) on " + std::to_string(n) +
                                            " GPUs, bytes crossing NVLink per rank over the time");
}

}  // namespace
#endif

HardwareProfile calibrate_hardware(const HardwareProfile& base, Communicator& world) {
#if defined(MOE_HAVE_CUDA)
  std::string why;
  MOE_CHECK(cuda_available(&why), "bench --calibrate measures this GPU, but none can be used: ", why);
  if (world.size() > 1) select_local_gpu();
  HardwareProfile p = base;
  const GpuInfo gpu = current_gpu();
  const Ceilings ceil = measure_ceilings(/*fp8=*/gpu.major == 9);
  MOE_CHECK(ceil.gemm_tflops > 0, "bench --calibrate: the ceilings could not be measured: ", ceil.why_not);
  if (world.rank() == 0)
    std::printf("calibrating '%s' on %s (%d rank%s); peaks from the profile: %.0f TFLOP/s BF16, %.0f FP8, %.2f TB/s\n",
                base.name.c_str(), gpu.name.c_str(), world.size(), world.size() == 1 ? "" : "s", base.peak_bf16_tflops,
                base.peak_fp8_tflops, base.memory_tb_s);
  measure_dense(p, ceil, world);
  measure_grouped(p, world);
  measure_attention(p, world);
  measure_memory_bound(p, ceil, world);
  fit_to_reference_steps(p, ceil, world);
  if (world.size() > 1) measure_links(p, world);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  p.measured = true;
  p.source = base.source + "; efficiencies measured by `moetrain bench --calibrate` on " + gpu.name + " (" +
             std::to_string(world.size()) + (world.size() == 1 ? " GPU" : " GPUs") + ", " + date +
             "); curves whose source does not say so are the base profile's";
  return p;
#else
  (void)base, (void)world;
  MOE_FAIL("bench --calibrate measures a GPU: this binary was built without CUDA (MOE_CUDA=OFF)");
#endif
}

}  // namespace moe

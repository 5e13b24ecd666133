// MOE_BENCH=1: the energy of each kind of GPU work in a bench-olmoe-4l step, measured alone with
// NVML's energy counter (core/gpu_power.h), FP8 against BF16. The H200 runs both precisions' steps
// at its 700 W limit, where a step's time is its energy over 700 W (bench/RESULTS.md, 2026-12-04):
// what a kernel costs the step is its joules, not its milliseconds. Each product runs back to back
// for about a second on random operands (constant ones toggle fewer bits and draw less power), and
// the line gives its time, rate, mean power, SM clock, and energy per call and per FLOP (or byte);
// a device copy gives the memory's own energy per byte beside the quantizer's.
// Without MOE_BENCH=1 (or without a GPU or NVML) the test skips: it measures, it checks nothing.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/gpu_power.h"
#include "moe/ops/fp8.h"
#include "moe/ops/gemm.h"
#include "moe/ops/grouped_gemm.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;

int64_t tiles(int64_t n) { return (n + kFp8Tile - 1) / kFp8Tile; }

// Random bytes for a buffer: a 64 MiB xorshift pattern, copied over the buffer (the repeat is far
// longer than any tile a kernel reads at once). `fix` maps each 16-bit word to a value of the type.
void fill_random(const DeviceBuffer& b, uint16_t (*fix)(uint16_t)) {
  std::vector<uint16_t> pattern(size_t{32} << 20);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (uint16_t& w : pattern) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    w = fix(static_cast<uint16_t>(x >> 24));
  }
  const size_t chunk = pattern.size() * sizeof(uint16_t);
  for (size_t at = 0; at < b.bytes(); at += chunk)
    CUDA_CHECK(cudaMemcpy(static_cast<char*>(b.tensor().data) + at, pattern.data(), std::min(chunk, b.bytes() - at),
                          cudaMemcpyHostToDevice));
}
// BF16 in +-[0.5, 2): random sign and mantissa.
uint16_t bf16_word(uint16_t r) { return static_cast<uint16_t>((r & 0x807f) | ((126 + ((r >> 7) & 1)) << 7)); }
// Two E4M3 codes of any finite value (the NaN codes 0x7f / 0xff are moved to 0x7e / 0xfe).
uint16_t e4m3_pair(uint16_t r) {
  for (int shift : {0, 8})
    if (((r >> shift) & 0x7f) == 0x7f) r = static_cast<uint16_t>(r ^ (1 << shift));
  return r;
}

struct Measured {
  double ms = 0, watts = 0, clock_mhz = 0, joules = 0;
  int64_t capped = 0, samples = 0;
};

// fn back to back for ~1 s after a warmup, inside one power window.
Measured measure(const std::function<void()>& fn, cudaStream_t stream) {
  const double once = testing::time_ms(fn, stream, 3, 1);
  const int iters = std::max(5, static_cast<int>(1000.0 / std::max(once, 0.01)));
  PowerMonitor monitor(0.005);
  EXPECT_TRUE(monitor.start()) << monitor.why();
  const double ms = testing::time_ms(fn, stream, 0, iters);  // waits for the work: the window holds it
  monitor.stop();
  const PowerSummary p = monitor.summary();
  EXPECT_TRUE(p.energy_measured);
  Measured m;
  m.ms = ms;
  m.watts = p.mean_power_w();
  m.clock_mhz = p.mean_sm_clock_mhz;
  m.joules = p.energy_per_step_j(m.ms * 1e-3);
  m.capped = p.power_capped;
  m.samples = p.samples;
  return m;
}

void report(const char* name, const Measured& m, double work, const char* unit) {
  // pJ per FLOP (or per byte moved): the energy per call over its work.
  std::printf("  %-34s %8.3f ms %8.1f %s %5.0f W %5.0f MHz (capped %3ld/%3ld) %7.3f J %6.3f pJ/%s\n", name, m.ms,
              work / (m.ms * 1e-3) * 1e-12, unit[0] == 'F' ? "TFLOP/s" : "TB/s   ", m.watts, m.clock_mhz,
              static_cast<long>(m.capped), static_cast<long>(m.samples), m.joules, m.joules / work * 1e12,
              unit[0] == 'F' ? "FLOP" : "B");
  std::fflush(stdout);
}
#endif

TEST(GpuEnergy, ExpertAndDenseProductsAndAQuantizerAtBenchShapes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  MOE_SKIP_UNLESS_BENCH("energy");
  if (PowerMonitor probe; !probe.available()) GTEST_SKIP() << probe.why();
  // bench-olmoe-4l: 32768 tokens, top 8 of 64 experts (even load), d 2048, h 1024; the LM head in
  // 4681-row chunks over a 50304 vocabulary; QKV 2048 -> 6144.
  constexpr int64_t E = 64, T = 32768, rows = T * 8, D = 2048, H = 1024, V = 50304, chunk = 4681, QKV = 3 * D;
  const int64_t Mp = fp8_columns_capacity(rows, E);
  std::vector<int32_t> offsets{0};
  for (int64_t e = 0; e < E; ++e) offsets.push_back(static_cast<int32_t>(rows / E * (e + 1)));
  DeviceBuffer off(DType::I32, {E + 1});
  off.upload_i32(offsets);
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  const Stream s{stream};

  struct Product {
    const char* name;
    int kind;  // 0 forward (x W^T), 1 data gradient (dy W), 2 weight gradient (dy^T x)
    int64_t n_out, k_in;
  };
  const Product products[] = {
      {"fwd gate_up", 0, 2 * H, D}, {"fwd down", 0, D, H},          {"dgrad down", 1, H, D},
      {"dgrad gate_up", 1, D, 2 * H}, {"wgrad down (=)", 2, D, H}, {"wgrad gate_up (=)", 2, 2 * H, D},
  };
  double fp8_j = 0, bf16_j = 0;
  {
    std::printf("FP8 expert products (64 experts x %lld rows, random codes, scales 1/64)\n",
                static_cast<long long>(rows / E));
    DeviceBuffer in(DType::FP8_E4M3, {rows, 2 * H}), in_s(DType::F32, {rows, tiles(2 * H)});
    DeviceBuffer w(DType::FP8_E4M3, {E, 2 * H, D}), w_s(DType::F32, {E, tiles(2 * H), tiles(D)});
    DeviceBuffer ca(DType::FP8_E4M3, {2 * H, Mp}), ca_s(DType::F32, {tiles(Mp), 2 * H});
    DeviceBuffer cb(DType::FP8_E4M3, {2 * H, Mp}), cb_s(DType::F32, {tiles(Mp), 2 * H});
    DeviceBuffer out(DType::BF16, {rows, 2 * H}), g(DType::F32, {E, 2 * H, D});
    for (const DeviceBuffer* b : {&in, &w, &ca, &cb}) fill_random(*b, e4m3_pair);
    for (const DeviceBuffer* b : {&in_s, &w_s, &ca_s, &cb_s}) {
      const std::vector<float> ones(b->bytes() / sizeof(float), 1.0f / 64);  // keeps BF16 outputs finite
      CUDA_CHECK(cudaMemcpy(b->tensor().data, ones.data(), b->bytes(), cudaMemcpyHostToDevice));
    }
    for (const Product& p : products) {
      const Measured m = measure(
          [&] {
            if (p.kind == 2)
              fp8_grouped_matmul_wgrad(
                  front(g, DType::F32, {E, p.n_out, p.k_in}),
                  {front(ca, DType::FP8_E4M3, {p.n_out, Mp}), front(ca_s, DType::F32, {tiles(Mp), p.n_out}),
                   Fp8Tiles::Columns},
                  {front(cb, DType::FP8_E4M3, {p.k_in, Mp}), front(cb_s, DType::F32, {tiles(Mp), p.k_in}),
                   Fp8Tiles::Columns},
                  off.tensor(), false, s);
            else
              fp8_grouped_matmul(front(out, DType::BF16, {rows, p.n_out}),
                                 {front(in, DType::FP8_E4M3, {rows, p.k_in}),
                                  front(in_s, DType::F32, {rows, tiles(p.k_in)}), Fp8Tiles::Rows},
                                 {front(w, DType::FP8_E4M3, {E, p.n_out, p.k_in}),
                                  front(w_s, DType::F32, {E, tiles(p.n_out), tiles(p.k_in)}), Fp8Tiles::Blocks},
                                 off.tensor(), s);
          },
          stream);
      fp8_j += m.joules;
      report(p.name, m, 2.0 * rows * p.n_out * p.k_in, "FLOP");
    }
    // The dense QKV projection (cuBLASLt, block scales).
    DeviceBuffer x(DType::FP8_E4M3, {T, D}), x_s(DType::F32, {T, tiles(D)});
    DeviceBuffer wq(DType::FP8_E4M3, {QKV, D}), wq_s(DType::F32, {tiles(QKV), tiles(D)}), y(DType::BF16, {T, QKV});
    fill_random(x, e4m3_pair);
    fill_random(wq, e4m3_pair);
    for (const DeviceBuffer* b : {&x_s, &wq_s}) {
      const std::vector<float> v(b->bytes() / sizeof(float), 1.0f / 64);
      CUDA_CHECK(cudaMemcpy(b->tensor().data, v.data(), b->bytes(), cudaMemcpyHostToDevice));
    }
    const Measured qkv = measure(
        [&] {
          fp8_matmul(y.tensor(), {x.tensor(), x_s.tensor(), Fp8Tiles::Rows},
                     {wq.tensor(), wq_s.tensor(), Fp8Tiles::Blocks}, false, s);
        },
        stream);
    report("dense QKV fwd (cuBLASLt)", qkv, 2.0 * T * QKV * D, "FLOP");
    // The weight gradient's two-scale promotion (both operands 1 x 128 along the tokens) through
    // cuBLASLt and through our CUTLASS kernel at one shape: 2048 x 2048 over T tokens, F32 out, as
    // one dense product and as one group. Tells whether the expert weight gradients' excess energy
    // per FLOP over the forward is the recipe's (both libraries pay it) or CUTLASS's mainloop.
    const int64_t Mp1 = fp8_columns_capacity(T, 1);
    DeviceBuffer off1(DType::I32, {2});
    off1.upload_i32({0, static_cast<int32_t>(T)});
    const Fp8Tensor dy_t{front(ca, DType::FP8_E4M3, {2 * H, Mp1}), front(ca_s, DType::F32, {tiles(Mp1), 2 * H}),
                         Fp8Tiles::Columns};
    const Fp8Tensor x_t{front(cb, DType::FP8_E4M3, {D, Mp1}), front(cb_s, DType::F32, {tiles(Mp1), D}),
                        Fp8Tiles::Columns};
    report("dense wgrad 1x128 both (cuBLASLt)",
           measure(
               [&] {
                 fp8_matmul(front(g, DType::F32, {2 * H, D}), dy_t, x_t, false, s);
               },
               stream),
           2.0 * T * 2 * H * D, "FLOP");
    report("dense wgrad 1x128 both (CUTLASS, 1 group)",
           measure(
               [&] {
                 fp8_grouped_matmul_wgrad(front(g, DType::F32, {1, 2 * H, D}), dy_t, x_t, off1.tensor(), false, s);
               },
               stream),
           2.0 * T * 2 * H * D, "FLOP");
  }
  {
    std::printf("BF16 expert products (the same shapes, random values)\n");
    DeviceBuffer in(DType::BF16, {rows, 2 * H}), out(DType::BF16, {rows, 2 * H});
    DeviceBuffer w(DType::BF16, {E, 2 * H, D}), g(DType::F32, {E, 2 * H, D});
    for (const DeviceBuffer* b : {&in, &out, &w}) fill_random(*b, bf16_word);
    for (const Product& p : products) {
      const Tensor x = front(in, DType::BF16, {rows, p.k_in}), y = front(out, DType::BF16, {rows, p.n_out});
      const Tensor wt = front(w, DType::BF16, p.kind == 1 ? Shape{E, p.k_in, p.n_out} : Shape{E, p.n_out, p.k_in});
      const Tensor gt = front(g, DType::F32, {E, p.n_out, p.k_in});
      const Measured m = measure(
          [&] {
            if (p.kind == 2) grouped_matmul_wgrad(gt, y, x, off.tensor(), s, false);
            else grouped_matmul(y, x, wt, off.tensor(), p.kind == 0, false, s);
          },
          stream);
      bf16_j += m.joules;
      report(p.name, m, 2.0 * rows * p.n_out * p.k_in, "FLOP");
    }
    // A BF16 dense forward y [M, N] = x [M, K] w [N, K]^T on random operands.
    const auto dense = [&](const char* name, int64_t M, int64_t N, int64_t K) {
      DeviceBuffer x(DType::BF16, {M, K}), w(DType::BF16, {N, K}), y(DType::BF16, {M, N});
      fill_random(x, bf16_word);
      fill_random(w, bf16_word);
      report(name, measure([&] { matmul(y.tensor(), x.tensor(), w.tensor(), false, true, 1.0f, 0.0f, s); }, stream),
             2.0 * M * N * K, "FLOP");
    };
    dense("dense QKV fwd (cuBLASLt)", T, QKV, D);
    dense("LM head chunk fwd (cuBLASLt)", chunk, V, D);  // one 4681-row chunk (BF16 in both precisions)
  }
  {
    // A memory-bound FP8 producer: one layer's routed output gradient quantized by rows and by
    // columns (2 bytes read, 1 + 1 written per element).
    std::printf("FP8 quantizer (routed rows, BF16 in)\n");
    DeviceBuffer x(DType::BF16, {rows, D}), q(DType::FP8_E4M3, {rows, D}), q_s(DType::F32, {rows, tiles(D)});
    DeviceBuffer c(DType::FP8_E4M3, {D, Mp}), c_s(DType::F32, {tiles(Mp), D});
    fill_random(x, bf16_word);
    report("quantize rows and columns",
           measure([&] {
             fp8_quantize_rows_and_columns({q.tensor(), q_s.tensor(), Fp8Tiles::Rows},
                                           {c.tensor(), c_s.tensor(), Fp8Tiles::Columns}, x.tensor(), off.tensor(), s);
           }, stream),
           4.0 * rows * D, "B");
    // Each half alone (2 bytes read, 1 written per element): which of them costs the energy.
    report("quantize rows alone",
           measure([&] { fp8_quantize_rows({q.tensor(), q_s.tensor(), Fp8Tiles::Rows}, x.tensor(), s); }, stream),
           3.0 * rows * D, "B");
    report("quantize columns alone",
           measure([&] {
             fp8_quantize_columns({c.tensor(), c_s.tensor(), Fp8Tiles::Columns}, x.tensor(), off.tensor(), s);
           }, stream),
           3.0 * rows * D, "B");
    // The memory's own cost per byte: a device copy of the same 1 GiB (read and written: 2 GiB moved).
    DeviceBuffer y(DType::BF16, {rows, D});
    report("device copy (baseline)",
           measure([&] { CUDA_CHECK(cudaMemcpyAsync(y.tensor().data, x.tensor().data, x.bytes(),
                                                    cudaMemcpyDeviceToDevice, stream)); }, stream),
           2.0 * static_cast<double>(x.bytes()), "B");
  }
  std::printf("one layer's six expert products: FP8 %.3f J, BF16 %.3f J (%.2fx)\n", fp8_j, bf16_j,
              fp8_j > 0 ? bf16_j / fp8_j : 0.0);
  CUDA_CHECK(cudaStreamDestroy(stream));
#endif
}

}  // namespace
}  // namespace moe

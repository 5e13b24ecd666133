// expert_gemm_variants_bench: the three BF16 expert products (forward, data gradient, weight
// gradient; variants.h) under several CUTLASS tile / cluster / schedule configurations, at the
// shapes of bench-olmoe-4l (64 experts, 262144 routed rows, d 2048, h 1024), of configs/fig4.toml
// at 8 experts (65536 rows, d 4096, h 4096), and with few rows per expert (128 experts, 1024 and
// 256 rows each), experts evenly loaded; `expert_gemm_variants_bench [CASE...]` runs some of them.
// Each configuration runs call after call for about a second (each call timed by its own event
// pair, so the short gaps between calls are in the window) on random operands (values +-[0.5, 2):
// constant ones toggle fewer bits and draw less power) inside one NVML energy window, because a
// Hopper GPU at its power limit runs a kernel as fast as its energy per FLOP allows: a short burst
// timed alone would rank the configurations by a clock the step never sees. Each line gives the
// median call time, rate, the window's mean power and SM clock, energy per FLOP (mean power x
// median time, over the FLOPs), and the largest difference from the first configuration (the
// library's) relative to the largest |output|, so a faster configuration is known to compute the
// same product.
// A tuning benchmark, built with -DMOE_BENCH_GEMM_VARIANTS=ON (it adds a dozen CUTLASS compiles).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "moe/core/gpu_power.h"
#include "moe/core/gpu_timer.h"
#include "variants.h"

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

namespace {

// BF16 in +-[0.5, 2): a hashed sign, exponent bit and mantissa per element.
__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const uint16_t bits = static_cast<uint16_t>((h & 0x807f) | ((126 + ((h >> 7) & 1)) << 7));
    p[i] = __ushort_as_bfloat16(bits);
  }
}

// max |x - y| and max |y| as float bits (non-negative floats order like their bits).
template <class T>
__global__ void max_diff(const T* x, const T* y, int64_t n, unsigned* out) {
  float d = 0, m = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float xi = static_cast<float>(x[i]), yi = static_cast<float>(y[i]);
    d = fmaxf(d, fabsf(xi - yi));
    m = fmaxf(m, fabsf(yi));
  }
  atomicMax(out, __float_as_uint(d));
  atomicMax(out + 1, __float_as_uint(m));
}

struct Case {
  const char* name;
  int experts;
  int64_t rows;
  int d, h;
};

struct ProductShape {
  const char* name;
  gemm_variants::Product product;
  int n_out, k_in;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace gemm_variants;
  // Per product (in Product's order): the cooperative configurations first (the library's leads).
  const auto both = [](std::vector<Variant> v, const std::vector<Variant>& more) {
    v.insert(v.end(), more.begin(), more.end());
    return v;
  };
  const std::vector<std::vector<Variant>> by_product = {
      both(variants_forward_cooperative(), variants_forward_pingpong()),
      both(variants_data_grad_cooperative(), variants_data_grad_pingpong()),
      both(variants_weight_grad_cooperative(), variants_weight_grad_pingpong()),
  };
  // The top-4 sweep's shapes (bench-olmoe-4l at top 4: 131072 rows) at 128 experts, and 256 rows per
  // expert, show the configurations where each expert has few rows; the sweep at 8 experts has the
  // same FLOPs as at 128 in 16x fewer, 16x longer groups.
  const std::vector<Case> all = {{"olmoe-4l", 64, 262144, 2048, 1024},
                                 {"fig4-e8", 8, 65536, 4096, 4096},
                                 {"top4-e8", 8, 131072, 2048, 1024},
                                 {"top4-e128", 128, 131072, 2048, 1024},
                                 {"e128-r256", 128, 32768, 2048, 1024}};
  std::vector<Case> cases;  // the cases named on the command line, else all
  for (int i = 1; i < argc; ++i) {
    const auto it =
        std::find_if(all.begin(), all.end(), [&](const Case& c) { return std::strcmp(c.name, argv[i]) == 0; });
    if (it == all.end()) {
      std::fprintf(stderr, "expert_gemm_variants_bench: no case '%s' (cases: olmoe-4l fig4-e8 top4-e8 top4-e128 e128-r256)\n",
                   argv[i]);
      return 2;
    }
    cases.push_back(*it);
  }
  if (cases.empty()) cases = all;
  // x: token rows [rows, <= max(2h, d)]; y: token rows too (weight gradient) or the weights
  // [E, n_out, k_in] (forward, data gradient); out and ref: F32 [E, n_out, k_in] or BF16 [rows, n_out].
  int64_t max_rows_operand = 0, max_weights = 0, max_experts = 0;
  for (const Case& c : cases) {
    max_rows_operand = std::max(max_rows_operand, c.rows * std::max(2 * c.h, c.d));
    max_weights = std::max(max_weights, int64_t{c.experts} * 2 * c.h * c.d);
    max_experts = std::max(max_experts, int64_t{c.experts});
  }
  const int64_t max_y = std::max(max_rows_operand, max_weights);
  const int64_t max_out = std::max(max_weights, (max_rows_operand + 1) / 2);  // F32 elements: BF16 rows fit in half

  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  void *x, *y, *out, *ref, *scratch_base;
  unsigned* diff;
  CHECK_CUDA(cudaMalloc(&x, max_rows_operand * 2));
  CHECK_CUDA(cudaMalloc(&y, max_y * 2));
  CHECK_CUDA(cudaMalloc(&out, max_out * 4));
  CHECK_CUDA(cudaMalloc(&ref, max_out * 4));
  CHECK_CUDA(cudaMalloc(&scratch_base, moe::cuda::cutlass_grouped::kScratchBytes));
  CHECK_CUDA(cudaMalloc(&diff, 2 * sizeof(unsigned)));
  int32_t* offsets;
  CHECK_CUDA(cudaMalloc(&offsets, (max_experts + 1) * sizeof(int32_t)));
  fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(x), max_rows_operand, 1u);
  fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(y), max_y, 2u);
  const Scratch scratch{scratch_base, device, prop.multiProcessorCount};
  for (const auto& variants : by_product)
    for (const Variant& v : variants) v.prepare();
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));

  std::printf("%-9s %-14s %-28s %8s %8s %5s %5s %6s %9s\n", "case", "product", "configuration", "ms", "TFLOP/s", "W",
              "MHz", "pJ/F", "rel diff");
  for (const Case& c : cases) {
    std::vector<int32_t> off(static_cast<size_t>(c.experts) + 1);
    for (int e = 0; e <= c.experts; ++e) off[static_cast<size_t>(e)] = static_cast<int32_t>(c.rows * e / c.experts);
    CHECK_CUDA(cudaMemcpy(offsets, off.data(), off.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    const ProductShape shapes[] = {
        {"fwd gate_up", Product::kForward, 2 * c.h, c.d},      {"fwd down", Product::kForward, c.d, c.h},
        {"dgrad down", Product::kDataGrad, c.h, c.d},          {"dgrad gate_up", Product::kDataGrad, c.d, 2 * c.h},
        {"wgrad gate_up", Product::kWeightGrad, 2 * c.h, c.d}, {"wgrad down", Product::kWeightGrad, c.d, c.h},
    };
    for (const ProductShape& sh : shapes) {
      const bool wgrad = sh.product == Product::kWeightGrad;
      const int64_t out_elems = wgrad ? int64_t{c.experts} * sh.n_out * sh.k_in : c.rows * sh.n_out;
      const double flop = 2.0 * static_cast<double>(c.rows) * sh.n_out * sh.k_in;
      const auto& variants = by_product[static_cast<size_t>(sh.product)];
      for (size_t vi = 0; vi < variants.size(); ++vi) {
        const Variant& v = variants[vi];
        void* dst = vi == 0 ? ref : out;
        auto once = [&] { v.run(dst, x, y, offsets, c.experts, c.rows, sh.n_out, sh.k_in, scratch, stream); };
        const double probe = moe::time_gpu(3, 3, once, stream).median_ms;
        const int iters = std::max(5, static_cast<int>(1000.0 / std::max(probe, 0.01)));
        moe::PowerMonitor monitor(0.005);
        const bool watched = monitor.start();
        const double ms = moe::time_gpu(0, iters, once, stream).median_ms;
        monitor.stop();
        const moe::PowerSummary p = monitor.summary();
        const double watts = watched && p.energy_measured ? p.mean_power_w() : 0.0;
        unsigned host[2] = {0, 0};
        if (vi > 0) {
          CHECK_CUDA(cudaMemsetAsync(diff, 0, sizeof(host), stream));
          if (wgrad)
            max_diff<<<1024, 256, 0, stream>>>(static_cast<const float*>(out), static_cast<const float*>(ref),
                                               out_elems, diff);
          else
            max_diff<<<1024, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(out),
                                               static_cast<const __nv_bfloat16*>(ref), out_elems, diff);
          CHECK_CUDA(cudaMemcpyAsync(host, diff, sizeof(host), cudaMemcpyDeviceToHost, stream));
          CHECK_CUDA(cudaStreamSynchronize(stream));
        }
        float d, m;
        std::memcpy(&d, &host[0], 4);
        std::memcpy(&m, &host[1], 4);
        std::printf("%-9s %-14s %-28s %8.3f %8.1f %5.0f %5.0f %6.3f %9.2e\n", c.name, sh.name, v.name, ms,
                    flop / (ms * 1e-3) / 1e12, watts, watched ? p.mean_sm_clock_mhz : 0.0,
                    watts * ms * 1e-3 / flop * 1e12,
                    vi == 0 ? 0.0 : static_cast<double>(d) / std::max(double{m}, 1e-30));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

// wgrad_variants_bench: the expert weight-gradient product db[e] = dc_e^T a_e (BF16 in, F32 out,
// written) under several CUTLASS tile / cluster / schedule configurations, on the shapes of the
// issue-6 MoE layer (T*K = 131072 routes spread evenly over E experts; gate_up: n_out 2048,
// k_in 2048; down: n_out 2048, k_in 1024). Prints the median time and TFLOP/s of each, and each
// variant's largest difference from the first (the library's configuration) relative to the
// largest |db|, so a faster configuration is known to compute the same product.
// A tuning benchmark, built with -DMOE_BENCH_WGRAD_VARIANTS=ON (it adds several CUTLASS compiles).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "moe/core/gpu_timer.h"
#include "variants.h"

#define CHECK_CUDA(x)                                                                                    \
  do {                                                                                                   \
    cudaError_t e_ = (x);                                                                                \
    if (e_ != cudaSuccess) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));           \
      std::exit(1);                                                                                      \
    }                                                                                                    \
  } while (0)

namespace {

__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16((static_cast<float>(h & 0xffff) / 65535.0f - 0.5f) * 2.0f);
  }
}

// max |x - y| and max |y| as float bits (non-negative floats order like their bits).
__global__ void max_diff(const float* x, const float* y, int64_t n, unsigned* out) {
  float d = 0, m = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    d = fmaxf(d, fabsf(x[i] - y[i]));
    m = fmaxf(m, fabsf(y[i]));
  }
  atomicMax(out, __float_as_uint(d));
  atomicMax(out + 1, __float_as_uint(m));
}

}  // namespace

int main() {
  using namespace wgrad_variants;
  std::vector<Variant> variants = variants_pingpong();
  for (const Variant& v : variants_cooperative()) variants.push_back(v);
  const int64_t rows = 32768 * 4, max_e = 128, max_n = 2048, max_k = 2048;
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  void *dc, *a, *db, *ref, *scratch_base;
  unsigned* diff;
  CHECK_CUDA(cudaMalloc(&dc, rows * max_n * 2));
  CHECK_CUDA(cudaMalloc(&a, rows * max_k * 2));
  CHECK_CUDA(cudaMalloc(&db, max_e * max_n * max_k * 4));
  CHECK_CUDA(cudaMalloc(&ref, max_e * max_n * max_k * 4));
  CHECK_CUDA(cudaMalloc(&scratch_base, moe::cuda::cutlass_grouped::kScratchBytes));
  CHECK_CUDA(cudaMalloc(&diff, 2 * sizeof(unsigned)));
  int32_t* offsets;
  CHECK_CUDA(cudaMalloc(&offsets, (max_e + 1) * sizeof(int32_t)));
  fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(dc), rows * max_n, 1u);
  fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(a), rows * max_k, 2u);
  const Scratch scratch{scratch_base, device, prop.multiProcessorCount};
  for (const Variant& v : variants) v.prepare();
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));

  std::printf("%-6s %-8s %-30s %9s %9s %12s\n", "E", "product", "variant", "ms", "TFLOP/s", "rel diff");
  for (int E : {8, 32, 128}) {
    std::vector<int32_t> off(static_cast<size_t>(E) + 1);
    for (int e = 0; e <= E; ++e) off[static_cast<size_t>(e)] = static_cast<int32_t>(rows * e / E);
    CHECK_CUDA(cudaMemcpy(offsets, off.data(), off.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    struct Shape {
      const char* name;
      int n_out, k_in;
    };
    for (const Shape sh : {Shape{"gate_up", 2048, 2048}, Shape{"down", 2048, 1024}}) {
      const int64_t out_elems = int64_t{E} * sh.n_out * sh.k_in;
      const double flop = 2.0 * static_cast<double>(rows) * sh.n_out * sh.k_in;
      for (size_t vi = 0; vi < variants.size(); ++vi) {
        const Variant& v = variants[vi];
        void* out = vi == 0 ? ref : db;
        auto once = [&] { v.run(out, dc, a, offsets, E, rows, sh.n_out, sh.k_in, scratch, stream); };
        const double median = moe::time_gpu(3, 15, once, stream).median_ms;
        unsigned host[2] = {0, 0};
        if (vi > 0) {
          CHECK_CUDA(cudaMemsetAsync(diff, 0, sizeof(host), stream));
          max_diff<<<1024, 256, 0, stream>>>(static_cast<const float*>(db), static_cast<const float*>(ref), out_elems,
                                             diff);
          CHECK_CUDA(cudaMemcpyAsync(host, diff, sizeof(host), cudaMemcpyDeviceToHost, stream));
          CHECK_CUDA(cudaStreamSynchronize(stream));
        }
        float d, m;
        std::memcpy(&d, &host[0], 4);
        std::memcpy(&m, &host[1], 4);
        std::printf("%-6d %-8s %-30s %9.3f %9.0f %12.2e\n", E, sh.name, v.name, median, flop / (median * 1e-3) / 1e12,
                    vi == 0 ? 0.0 : static_cast<double>(d) / std::max(static_cast<double>(m), 1e-30));
      }
    }
  }
  return 0;
}

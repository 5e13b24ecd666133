// Candidate CUTLASS configurations for the three BF16 expert products, compared by
// expert_gemm_variants_bench.cu on whichever Hopper GPU runs it:
//   forward (c = a b[e]^T, BF16 out), data gradient (c = a b[e], BF16 out), weight gradient
//   (db[e] = dc_e^T a_e, F32 out, written).
// The first variant of each product is the library's configuration (grouped_gemm_cutlass.cuh's
// defaults: cooperative 128x256x64, 1x2 clusters); the first pingpong one (128x128x64, 2x1 clusters) is
// what it used before.
// Each variants_*.cu instantiates a few GroupedGemm configurations (grouped_gemm_cutlass.cuh) in
// its own translation unit, so the CUTLASS compiles spread over the build's cores.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "moe/ops/cuda/grouped_gemm_cutlass.h"

namespace gemm_variants {

using moe::cuda::cutlass_grouped::Scratch;

using Product = moe::cuda::cutlass_grouped::ExpertProduct;

struct Variant {
  const char* name;
  void (*prepare)();
  // kForward / kDataGrad: out = c [rows, n_out] BF16, x = a [rows, k_in], y = b[e] ([n_out, k_in] forward,
  // [k_in, n_out] data gradient). kWeightGrad: out = db [E, n_out, k_in] F32 (beta = 0), x = dc
  // [rows, n_out], y = a [rows, k_in]. Per-expert rows from offsets.
  void (*run)(void* out, const void* x, const void* y, const int32_t* offsets, int groups, int64_t rows, int n_out,
              int k_in, const Scratch& scratch, cudaStream_t stream);
};

std::vector<Variant> variants_forward_pingpong();
std::vector<Variant> variants_forward_cooperative();
std::vector<Variant> variants_data_grad_pingpong();
std::vector<Variant> variants_data_grad_cooperative();
std::vector<Variant> variants_weight_grad_pingpong();
std::vector<Variant> variants_weight_grad_cooperative();

}  // namespace gemm_variants

// Candidate CUTLASS configurations for the expert weight-gradient product (db[e] = dc_e^T a_e, F32
// out), compared on the H200 by wgrad_variants_bench.cu. Each variants_*.cu instantiates a few
// GroupedGemm configurations (grouped_gemm_cutlass.cuh) in its own translation unit, so the
// CUTLASS compiles spread over the build's cores.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "moe/ops/cuda/grouped_gemm_cutlass.h"

namespace wgrad_variants {

using moe::cuda::cutlass_grouped::Scratch;

struct Variant {
  const char* name;
  void (*prepare)();
  // db (F32, written: beta = 0) from dc [rows, n_out] and a [rows, k_in] (BF16), per-expert rows from offsets.
  void (*run)(void* db, const void* dc, const void* a, const int32_t* offsets, int groups, int64_t rows, int n_out,
              int k_in, const Scratch& scratch, cudaStream_t stream);
};

std::vector<Variant> variants_pingpong();
std::vector<Variant> variants_cooperative();

}  // namespace wgrad_variants

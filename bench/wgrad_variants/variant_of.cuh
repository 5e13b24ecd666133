// make_variant<G>: a Variant that runs the GroupedGemm configuration G as the weight gradient.
#pragma once

#include "moe/ops/cuda/grouped_gemm_cutlass.cuh"
#include "variants.h"

namespace wgrad_variants {

namespace cg = moe::cuda::cutlass_grouped;

template <class Tile, class Cluster, class KernelSchedule, class EpilogueSchedule>
using WgradGemm = cg::GroupedGemm<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float, Tile, Cluster,
                                  KernelSchedule, EpilogueSchedule>;

template <class G>
Variant make_variant(const char* name) {
  return {name, [] { cg::prepare_kernel<G>(); },
          [](void* db, const void* dc, const void* a, const int32_t* offsets, int groups, int64_t rows, int n_out,
             int k_in, const Scratch& scratch, cudaStream_t stream) {
            cg::run_grouped<G, cg::Product::kWgrad>(db, dc, a, offsets, groups, rows, n_out, k_in, 0.0f, scratch,
                                                    stream, "wgrad variant");
          }};
}

}  // namespace wgrad_variants

// make_variant<G, P>: a Variant that runs the GroupedGemm configuration G as product P, and the
// configurations' names.
#pragma once

#include "moe/ops/cuda/grouped_gemm_cutlass.cuh"
#include "variants.h"

namespace gemm_variants {

namespace cg = moe::cuda::cutlass_grouped;
using PP = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
using PPEpi = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
using Coop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
using CoopEpi = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;

template <Product P, class Tile, class Cluster, class KernelSchedule, class EpilogueSchedule>
using GemmOf = cg::ExpertGemm<P, Tile, Cluster, KernelSchedule, EpilogueSchedule>;

template <Product P, class G>
Variant make_variant(const char* name) {
  return {name, [] { cg::prepare_kernel<G>(); },
          [](void* out, const void* x, const void* y, const int32_t* offsets, int groups, int64_t rows, int n_out,
             int k_in, const Scratch& scratch, cudaStream_t stream) {
            cg::run_grouped<G, P>(out, x, y, offsets, groups, rows, n_out, k_in, 0.0f, scratch, stream,
                                  "expert GEMM variant");
          }};
}

// The configurations every product is tried in. Pingpong: one 128x128 tile per consumer warp
// group, one group's epilogue under the other's mainloop (2x1 clusters: the library's until the
// twenty-fifth session).
// Cooperative: both consumer warp groups on one larger tile (each operand byte loaded feeds more
// output; the epilogue is not hidden under a mainloop). 128x256 with 1x2 clusters is the library's.
template <Product P>
std::vector<Variant> pingpong_variants() {
  using namespace cute;
  return {
      make_variant<P, GemmOf<P, Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, PPEpi>>("pingpong 128x128x64 c2x1"),
      make_variant<P, GemmOf<P, Shape<_128, _128, _64>, Shape<_1, _2, _1>, PP, PPEpi>>("pingpong 128x128x64 c1x2"),
  };
}
template <Product P>
std::vector<Variant> cooperative_variants() {
  using namespace cute;
  return {
      make_variant<P, GemmOf<P, Shape<_128, _256, _64>, Shape<_1, _2, _1>, Coop, CoopEpi>>(
          "cooperative 128x256x64 c1x2"),
      make_variant<P, GemmOf<P, Shape<_256, _128, _64>, Shape<_2, _1, _1>, Coop, CoopEpi>>(
          "cooperative 256x128x64 c2x1"),
  };
}

}  // namespace gemm_variants

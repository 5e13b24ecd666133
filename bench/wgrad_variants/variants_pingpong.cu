// Pingpong configurations: one 128x128 tile per consumer warp group, one group's epilogue under
// the other's mainloop. The first is the library's (grouped_gemm_cutlass_wgrad.cu).
#include "variant_of.cuh"

namespace wgrad_variants {

using namespace cute;
using PP = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
using PPEpi = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;

std::vector<Variant> variants_pingpong() {
  return {
      make_variant<WgradGemm<Shape<_128, _128, _64>, Shape<_2, _1, _1>, PP, PPEpi>>("pingpong 128x128x64 c2x1"),
      make_variant<WgradGemm<Shape<_128, _128, _64>, Shape<_1, _2, _1>, PP, PPEpi>>("pingpong 128x128x64 c1x2"),
      make_variant<WgradGemm<Shape<_128, _128, _64>, Shape<_1, _1, _1>, PP, PPEpi>>("pingpong 128x128x64 c1x1"),
      make_variant<WgradGemm<Shape<_64, _256, _64>, Shape<_1, _2, _1>, PP, PPEpi>>("pingpong 64x256x64 c1x2"),
  };
}

}  // namespace wgrad_variants

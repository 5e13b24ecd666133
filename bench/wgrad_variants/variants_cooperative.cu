// Cooperative configurations: both consumer warp groups on one larger tile (fewer, bigger tiles:
// each operand byte loaded feeds more output; the epilogue is not hidden under a mainloop).
#include "variant_of.cuh"

namespace wgrad_variants {

using namespace cute;
using Coop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
using CoopEpi = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;

std::vector<Variant> variants_cooperative() {
  return {
      make_variant<WgradGemm<Shape<_256, _128, _64>, Shape<_2, _1, _1>, Coop, CoopEpi>>("cooperative 256x128x64 c2x1"),
      make_variant<WgradGemm<Shape<_128, _256, _64>, Shape<_1, _2, _1>, Coop, CoopEpi>>("cooperative 128x256x64 c1x2"),
      make_variant<WgradGemm<Shape<_256, _128, _64>, Shape<_1, _1, _1>, Coop, CoopEpi>>("cooperative 256x128x64 c1x1"),
  };
}

}  // namespace wgrad_variants

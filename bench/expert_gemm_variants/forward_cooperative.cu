// The cooperative configurations of the forward product (one translation unit: its CUTLASS compiles).
#include "variant_of.cuh"

namespace gemm_variants {

std::vector<Variant> variants_forward_cooperative() { return cooperative_variants<Product::kForward>(); }

}  // namespace gemm_variants

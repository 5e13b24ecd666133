// The pingpong configurations of the forward product (one translation unit: its CUTLASS compiles).
#include "variant_of.cuh"

namespace gemm_variants {

std::vector<Variant> variants_forward_pingpong() { return pingpong_variants<Product::kForward>(); }

}  // namespace gemm_variants

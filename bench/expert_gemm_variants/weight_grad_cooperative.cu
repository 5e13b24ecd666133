// The cooperative configurations of the weight-gradient product (one translation unit: its CUTLASS compiles).
#include "variant_of.cuh"

namespace gemm_variants {

std::vector<Variant> variants_weight_grad_cooperative() { return cooperative_variants<Product::kWeightGrad>(); }

}  // namespace gemm_variants

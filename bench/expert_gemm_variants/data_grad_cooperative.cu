// The cooperative configurations of the data-gradient product (one translation unit: its CUTLASS compiles).
#include "variant_of.cuh"

namespace gemm_variants {

std::vector<Variant> variants_data_grad_cooperative() { return cooperative_variants<Product::kDataGrad>(); }

}  // namespace gemm_variants

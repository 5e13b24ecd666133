#include "moe/ops/route.h"

#include "moe/ops/cpu/route.h"
#include "moe/ops/dispatch.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/route.h")
#include "moe/ops/cuda/route.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void route_counts(Tensor expert_counts, Tensor topk_idx, Stream stream) {
  MOE_OP_DISPATCH(topk_idx.device, route_counts, expert_counts, topk_idx, stream);
}

void route_index_local(Tensor route_index, Tensor expert_offsets, Tensor topk_idx, Tensor expert_counts,
                       int64_t rank_capacity, Stream stream) {
  MOE_OP_DISPATCH(topk_idx.device, route_index_local, route_index, expert_offsets, topk_idx, expert_counts,
                  rank_capacity, stream);
}

void accumulate_counts(Tensor load, Tensor counts, Stream stream) {
  MOE_OP_DISPATCH(load.device, accumulate_counts, load, counts, stream);
}

}  // namespace moe

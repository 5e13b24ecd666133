#include "moe/ops/permute.h"

#include "moe/ops/cpu/permute.h"
#include "moe/ops/dispatch.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/permute.h")
#include "moe/ops/cuda/permute.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void gather_rows(Tensor dst, Tensor src, Tensor route_index, int top_k, Stream stream) {
  MOE_OP_DISPATCH(src.device, gather_rows, dst, src, route_index, top_k, stream);
}

void gather_rows_backward(Tensor dsrc, Tensor ddst, Tensor route_index, int top_k, bool accumulate, Stream stream) {
  MOE_OP_DISPATCH(dsrc.device, gather_rows_backward, dsrc, ddst, route_index, top_k, accumulate, stream);
}

void combine_rows(Tensor out, Tensor y, Tensor weights, Tensor route_index, int top_k, bool accumulate, Stream stream) {
  MOE_OP_DISPATCH(out.device, combine_rows, out, y, weights, route_index, top_k, accumulate, stream);
}

void combine_rows_backward(Tensor dy, Tensor dweights, Tensor dout, Tensor y, Tensor weights, Tensor route_index,
                           int top_k, Stream stream) {
  MOE_OP_DISPATCH(dout.device, combine_rows_backward, dy, dweights, dout, y, weights, route_index, top_k, stream);
}

}  // namespace moe

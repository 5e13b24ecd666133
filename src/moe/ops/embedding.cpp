#include "moe/ops/embedding.h"

#include "moe/ops/cpu/embedding.h"
#include "moe/ops/dispatch.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/embedding.h")
#include "moe/ops/cuda/embedding.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

void embedding_forward(Tensor out, Tensor table, Tensor tokens, Stream stream) {
  MOE_OP_DISPATCH(table.device, embedding_forward, out, table, tokens, stream);
}

void embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Stream stream) {
  MOE_OP_DISPATCH(dtable.device, embedding_backward, dtable, dout, tokens, stream);
}

void add_inplace(Tensor y, Tensor x, Stream stream) { MOE_OP_DISPATCH(y.device, add_inplace, y, x, stream); }

void fill_zero(Tensor y, Stream stream) { MOE_OP_DISPATCH(y.device, fill_zero, y, stream); }

void copy(Tensor dst, Tensor src, Stream stream) { MOE_OP_DISPATCH(dst.device, copy, dst, src, stream); }

void cast_copy(Tensor dst, Tensor src, Stream stream) { MOE_OP_DISPATCH(dst.device, cast_copy, dst, src, stream); }

void accumulate_scalars(Tensor stats, const std::vector<ScalarTerm>& terms, Stream stream) {
  MOE_OP_DISPATCH(stats.device, accumulate_scalars, stats, terms, stream);
}

}  // namespace moe

#include "moe/ops/rope.h"

#include "moe/ops/cpu/rope.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/rope.h")
#include "moe/ops/cuda/rope.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

namespace {

// x [B*T, H*hd] of the device's compute dtype: whole sequences, whole heads of an even width.
void check_rope(const char* op, const Tensor& x, int64_t seq_len, int64_t n_heads, float theta) {
  const OpCheck check(op, x.device);
  check.compute_dtype("x", x);
  MOE_CHECK(x.ndim() == 2, op, ": x must be 2-D [B*T, H*hd], got ", x.shape.str());
  MOE_CHECK(seq_len > 0, op, ": seq_len must be positive, got ", seq_len);
  MOE_CHECK(n_heads > 0 && x.dim(1) % n_heads == 0, op, ": row width ", x.dim(1), " is not a multiple of n_heads ",
            n_heads);
  const int64_t hd = x.dim(1) / n_heads;
  MOE_CHECK(hd % 2 == 0, op, ": head dim ", hd, " must be even");
  MOE_CHECK(x.dim(0) % seq_len == 0, op, ": ", x.dim(0), " rows are not a whole number of sequences of ", seq_len);
  MOE_CHECK(theta > 0.0f, op, ": theta must be positive, got ", theta);
}

}  // namespace

void rope_forward(Tensor x, int64_t seq_len, int64_t n_heads, float theta, Stream stream) {
  check_rope("rope_forward", x, seq_len, n_heads, theta);
  MOE_OP_DISPATCH(x.device, rope_forward, x, seq_len, n_heads, theta, stream);
}

void rope_backward(Tensor dx, int64_t seq_len, int64_t n_heads, float theta, Stream stream) {
  check_rope("rope_backward", dx, seq_len, n_heads, theta);
  MOE_OP_DISPATCH(dx.device, rope_backward, dx, seq_len, n_heads, theta, stream);
}

}  // namespace moe

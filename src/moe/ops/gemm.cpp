#include "moe/ops/gemm.h"

#include "moe/ops/cpu/gemm.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/gemm.h")
#include "moe/ops/cuda/gemm.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

namespace {

// Rows (all leading dims folded) and columns of a tensor of rank >= 2.
struct Matrix2d {
  int64_t rows = 0;
  int64_t cols = 0;
};

Matrix2d as_2d(const OpCheck& check, const char* name, const Tensor& t) {
  MOE_CHECK(t.ndim() >= 2, check.op(), ": ", name, " must have rank >= 2, got shape ", t.shape.str());
  Matrix2d m;
  m.cols = t.dim(-1);
  m.rows = 1;
  for (int i = 0; i + 1 < t.ndim(); ++i) m.rows *= t.dim(i);
  return m;
}

}  // namespace

void matmul(Tensor c, Tensor a, Tensor b, bool trans_a, bool trans_b, float alpha, float beta, Stream stream) {
  const OpCheck check("matmul", c.device);
  const DType T = check.compute_dtype("a", a);
  check.same_dtype("b", b, "a", a);
  check.output_dtype("c", c, T);
  const Matrix2d ma = as_2d(check, "a", a), mb = as_2d(check, "b", b), mc = as_2d(check, "c", c);
  const int64_t M = mc.rows, N = mc.cols;
  const int64_t K = trans_a ? ma.rows : ma.cols;
  const int64_t a_m = trans_a ? ma.cols : ma.rows;
  const int64_t b_k = trans_b ? mb.cols : mb.rows;
  const int64_t b_n = trans_b ? mb.rows : mb.cols;
  MOE_CHECK(a_m == M && b_k == K && b_n == N, "matmul: shapes do not agree: c ", c.shape.str(), ", a ",
            a.shape.str(), (trans_a ? " (transposed)" : ""), ", b ", b.shape.str(), (trans_b ? " (transposed)" : ""));
  constexpr int64_t kIntMax = 2147483647;
  MOE_CHECK(M <= kIntMax && N <= kIntMax && K <= kIntMax, "matmul: dimensions M=", M, " N=", N, " K=", K,
            " exceed the BLAS int range");
  MOE_OP_DISPATCH(c.device, matmul, c, a, b, trans_a, trans_b, alpha, beta, stream);
}

}  // namespace moe

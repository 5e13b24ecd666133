// CPU matmul: one cblas_sgemm call on row-major 2-D views. Leading dims fold into rows.
#include "moe/ops/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>

namespace moe::cpu {
namespace {

struct Matrix2d {
  int64_t rows = 0;
  int64_t cols = 0;
};

Matrix2d as_2d(const Tensor& t, const char* name) {
  MOE_CHECK(t.device == Device::CPU, "matmul: tensor ", name, " is not on the CPU");
  MOE_CHECK(t.dtype == DType::F32, "matmul: tensor ", name, " must be F32, got ", dtype_name(t.dtype));
  MOE_CHECK(t.ndim() >= 2, "matmul: tensor ", name, " must have rank >= 2, got shape ", t.shape.str());
  Matrix2d m;
  m.cols = t.dim(-1);
  m.rows = 1;
  for (int i = 0; i + 1 < t.ndim(); ++i) m.rows *= t.dim(i);
  return m;
}

}  // namespace

void matmul(Tensor c, Tensor a, Tensor b, bool trans_a, bool trans_b, float alpha, float beta, Stream /*stream*/) {
  const Matrix2d ma = as_2d(a, "a"), mb = as_2d(b, "b"), mc = as_2d(c, "c");
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
  if (M == 0 || N == 0) return;
  float* cp = c.f32();
  if (K == 0) {  // empty sum: c = beta * c (beta == 0 writes zeros even over NaN, as BLAS does)
    const int64_t n = M * N;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) cp[i] = beta == 0.0f ? 0.0f : beta * cp[i];
    return;
  }
  // Leading dimensions of the row-major storage; BLAS wants them >= 1.
  const int lda = static_cast<int>(std::max<int64_t>(1, ma.cols));
  const int ldb = static_cast<int>(std::max<int64_t>(1, mb.cols));
  const int ldc = static_cast<int>(std::max<int64_t>(1, N));
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, a.f32(), lda, b.f32(), ldb, beta,
              cp, ldc);
}

}  // namespace moe::cpu

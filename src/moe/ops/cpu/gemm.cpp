// CPU matmul: one cblas_sgemm call on row-major 2-D views. Leading dims fold into rows.
#include "moe/ops/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>

namespace moe::cpu {
namespace {

// The rows of t read as a matrix (ops/gemm.cpp checked the rank is at least 2): leading dims folded.
int64_t folded_rows(const Tensor& t) {
  int64_t rows = 1;
  for (int i = 0; i + 1 < t.ndim(); ++i) rows *= t.dim(i);
  return rows;
}

}  // namespace

void matmul(Tensor c, Tensor a, Tensor b, bool trans_a, bool trans_b, float alpha, float beta, Stream /*stream*/) {
  const int64_t M = folded_rows(c), N = c.dim(-1);
  const int64_t K = trans_a ? folded_rows(a) : a.dim(-1);
  if (M == 0 || N == 0) return;
  float* cp = c.f32();
  if (K == 0) {  // empty sum: c = beta * c (beta == 0 writes zeros even over NaN, as BLAS does)
    const int64_t n = M * N;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) cp[i] = beta == 0.0f ? 0.0f : beta * cp[i];
    return;
  }
  // Leading dimensions of the row-major storage; BLAS wants them >= 1.
  const int lda = static_cast<int>(std::max<int64_t>(1, a.dim(-1)));
  const int ldb = static_cast<int>(std::max<int64_t>(1, b.dim(-1)));
  const int ldc = static_cast<int>(std::max<int64_t>(1, N));
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, a.f32(), lda, b.f32(), ldb, beta,
              cp, ldc);
}

}  // namespace moe::cpu

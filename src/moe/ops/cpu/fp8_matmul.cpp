// CPU FP8 products, emulated exactly: the operands' codes times their power-of-two scales are
// exact FP32 values, so dequantizing them into one scratch buffer per call and multiplying with
// OpenBLAS sgemm gives the FP8 product up to FP32 summation order (the GPU's own difference).
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "moe/ops/cpu/fp8.h"
#include "moe/ops/cpu/gemm.h"

namespace moe::cpu {

void fp8_matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, bool accumulate, Stream stream) {
  const int64_t M = a.codes.dim(0), K = a.codes.dim(1), N = b.codes.dim(0);
  std::vector<float> scratch(static_cast<size_t>((M + N) * K));
  float* av = scratch.data();
  float* bv = av + M * K;
  fp8_dequantize_rows_f32(a, 0, M, av);
  fp8_dequantize_rows_f32(b, 0, N, bv);
  matmul(c, f32_tensor(av, {M, K}), f32_tensor(bv, {N, K}), false, true, 1.0f, accumulate ? 1.0f : 0.0f, stream);
}

// a's rows of all experts are dequantized once; b one expert at a time into a reused buffer, and
// only for experts with rows.
void fp8_grouped_matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, Tensor expert_offsets, Stream /*stream*/) {
  const int64_t E = b.codes.dim(0), N = b.codes.dim(1), K = b.codes.dim(2);
  const int32_t* o = expert_offsets.i32();
  const int64_t first = o[0], rows = o[E] - o[0];
  std::vector<float> scratch(static_cast<size_t>((rows + N) * K));
  float* av = scratch.data();
  float* be = av + rows * K;
  fp8_dequantize_rows_f32(a, first, o[E], av);
  float* cv = c.f32();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = o[e + 1] - o[e];
    if (m == 0) continue;  // no zero-sized sgemm reaches the BLAS
    fp8_dequantize_rows_f32(b, e * N, (e + 1) * N, be);
    // NOTES: beta = 0 makes sgemm overwrite c without reading it, so stale NaNs in c do not leak.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m), static_cast<blasint>(N),
                static_cast<blasint>(K), 1.0f, av + (o[e] - first) * K, static_cast<blasint>(K), be,
                static_cast<blasint>(K), 0.0f, cv + o[e] * N, static_cast<blasint>(N));
  }
}

// db[e] [N, K] (+)= dc_e [N, M_e] x_e [K, M_e]^T, read from expert e's column segment at p_e. The
// contraction runs over the M_e token columns only: the segment's padding columns are code 0 and
// would add exact zeros.
void fp8_grouped_matmul_wgrad(Tensor db, Fp8Tensor dc_t, Fp8Tensor x_t, Tensor expert_offsets, bool accumulate,
                              Stream /*stream*/) {
  const int64_t E = db.dim(0), N = db.dim(1), K = db.dim(2), Mp = x_t.codes.dim(1);
  const int32_t* o = expert_offsets.i32();
  float* dbv = db.f32();
  const int64_t per_expert = N * K;
  const bool any_rows = o[E] > o[0];
  std::vector<float> scratch(any_rows ? static_cast<size_t>((N + K) * Mp) : 0);
  float* dcv = scratch.data();
  float* xv = dcv + N * Mp;
  if (any_rows) {
    fp8_dequantize_rows_f32(dc_t, 0, N, dcv);
    fp8_dequantize_rows_f32(x_t, 0, K, xv);
  }
  int64_t column = 0;  // p_e
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = o[e + 1] - o[e];
    float* dbe = dbv + e * per_expert;
    if (m == 0) {
      if (!accumulate) std::fill(dbe, dbe + per_expert, 0.0f);
      continue;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(N), static_cast<blasint>(K),
                static_cast<blasint>(m), 1.0f, dcv + column, static_cast<blasint>(Mp), xv + column,
                static_cast<blasint>(Mp), accumulate ? 1.0f : 0.0f, dbe, static_cast<blasint>(K));
    column += (m + kFp8Tile - 1) / kFp8Tile * kFp8Tile;
  }
}

}  // namespace moe::cpu

// CPU grouped GEMM: a loop over experts, one OpenBLAS sgemm each (OpenBLAS threads inside the
// product). Experts with zero rows are skipped, so no zero-sized sgemm reaches the BLAS.
#include "moe/ops/cpu/grouped_gemm.h"

#include <algorithm>

#include <cblas.h>

namespace moe::cpu {

void grouped_matmul(Tensor c, Tensor a, Tensor b, Tensor expert_offsets, bool trans_b, bool accumulate,
                    Stream /*stream*/) {
  const int64_t E = b.dim(0);
  const int64_t k_in = a.dim(1);
  const int64_t n_out = trans_b ? b.dim(1) : b.dim(2);
  const int32_t* o = expert_offsets.i32();
  const float* av = a.f32();
  const float* bv = b.f32();
  float* cv = c.f32();
  // NOTES: beta = 0 makes sgemm overwrite C without reading it, so stale NaNs in c do not leak.
  const float beta = accumulate ? 1.0f : 0.0f;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = o[e + 1] - o[e];
    if (m == 0) continue;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
                static_cast<blasint>(n_out), static_cast<blasint>(k_in), 1.0f, av + o[e] * k_in,
                static_cast<blasint>(k_in), bv + e * n_out * k_in, static_cast<blasint>(trans_b ? k_in : n_out), beta,
                cv + o[e] * n_out, static_cast<blasint>(n_out));
  }
}

void grouped_matmul_wgrad(Tensor db, Tensor dc, Tensor a, Tensor expert_offsets, Stream /*stream*/,
                          bool accumulate) {
  const int64_t E = db.dim(0), n_out = db.dim(1), k_in = db.dim(2);
  const int32_t* o = expert_offsets.i32();
  const float* av = a.f32();
  const float* dcv = dc.f32();
  float* dbv = db.f32();
  const int64_t per_expert = n_out * k_in;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = o[e + 1] - o[e];
    if (m == 0) {
      if (!accumulate) std::fill(dbv + e * per_expert, dbv + (e + 1) * per_expert, 0.0f);
      continue;
    }
    // db[e] [n_out, k_in] (+)= dc_e^T [n_out, m] * a_e [m, k_in]  (accumulated: gradient accumulation).
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<blasint>(n_out), static_cast<blasint>(k_in),
                static_cast<blasint>(m), 1.0f, dcv + o[e] * n_out, static_cast<blasint>(n_out), av + o[e] * k_in,
                static_cast<blasint>(k_in), accumulate ? 1.0f : 0.0f, dbv + e * per_expert, static_cast<blasint>(k_in));
  }
}

}  // namespace moe::cpu

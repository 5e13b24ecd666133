// CPU grouped GEMM: a loop over experts, one OpenBLAS sgemm each (OpenBLAS threads inside the
// product). Experts with zero rows are skipped, so no zero-sized sgemm reaches the BLAS.
#include "moe/ops/cpu/grouped_gemm.h"

#include <algorithm>

#include <cblas.h>

namespace moe::cpu {

namespace {

void check_f32(const Tensor& t, int ndim, const char* op, const char* name) {
  MOE_CHECK(t.data != nullptr || t.numel() == 0, op, ": ", name, " has no data");
  MOE_CHECK(t.device == Device::CPU, op, ": ", name, " is on ", device_name(t.device), ", expected cpu");
  MOE_CHECK(t.dtype == DType::F32, op, ": ", name, " has dtype ", dtype_name(t.dtype), ", expected F32");
  MOE_CHECK(t.ndim() == ndim, op, ": ", name, " must be ", ndim, "-D, got ", t.shape.str());
}

// expert_offsets [E+1] I32, non-decreasing from offsets[0] >= 0 up to offsets[E] <= rows.
void check_offsets(const Tensor& expert_offsets, int64_t E, int64_t rows, const char* op) {
  MOE_CHECK(expert_offsets.device == Device::CPU, op, ": expert_offsets is on ", device_name(expert_offsets.device),
            ", expected cpu");
  MOE_CHECK(expert_offsets.dtype == DType::I32, op, ": expert_offsets has dtype ", dtype_name(expert_offsets.dtype),
            ", expected I32");
  MOE_CHECK(expert_offsets.ndim() == 1 && expert_offsets.dim(0) == E + 1, op, ": expert_offsets has shape ",
            expert_offsets.shape.str(), ", expected [", E + 1, "] (experts + 1)");
  const int32_t* o = expert_offsets.i32();
  MOE_CHECK(o[0] >= 0, op, ": expert_offsets[0] = ", o[0], " is negative");
  for (int64_t e = 0; e < E; ++e)
    MOE_CHECK(o[e] <= o[e + 1], op, ": expert_offsets decrease at expert ", e, " (", o[e], " > ", o[e + 1], ")");
  MOE_CHECK(o[E] <= rows, op, ": expert_offsets[", E, "] = ", o[E], " exceeds the ", rows, " buffer rows");
}

}  // namespace

void grouped_matmul(Tensor c, Tensor a, Tensor b, Tensor expert_offsets, bool trans_b, bool accumulate,
                    Stream /*stream*/) {
  constexpr const char* op = "grouped_matmul";
  check_f32(a, 2, op, "a");
  check_f32(b, 3, op, "b");
  check_f32(c, 2, op, "c");
  const int64_t E = b.dim(0);
  const int64_t k_in = a.dim(1);
  const int64_t n_out = trans_b ? b.dim(1) : b.dim(2);
  const int64_t b_k = trans_b ? b.dim(2) : b.dim(1);
  MOE_CHECK(b_k == k_in, op, ": b ", b.shape.str(), (trans_b ? " (trans_b)" : ""), " does not match a ", a.shape.str(),
            " in the inner dimension");
  MOE_CHECK(c.dim(1) == n_out, op, ": c has ", c.dim(1), " columns, expected ", n_out, " from b ", b.shape.str());
  MOE_CHECK(k_in >= 1 && n_out >= 1, op, ": empty inner or output dimension (a ", a.shape.str(), ", b ", b.shape.str(),
            ")");
  const int64_t rows = a.dim(0) < c.dim(0) ? a.dim(0) : c.dim(0);
  check_offsets(expert_offsets, E, rows, op);

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
  constexpr const char* op = "grouped_matmul_wgrad";
  check_f32(db, 3, op, "db");
  check_f32(dc, 2, op, "dc");
  check_f32(a, 2, op, "a");
  const int64_t E = db.dim(0), n_out = db.dim(1), k_in = db.dim(2);
  MOE_CHECK(dc.dim(1) == n_out, op, ": dc has ", dc.dim(1), " columns, expected ", n_out, " from db ", db.shape.str());
  MOE_CHECK(a.dim(1) == k_in, op, ": a has ", a.dim(1), " columns, expected ", k_in, " from db ", db.shape.str());
  MOE_CHECK(k_in >= 1 && n_out >= 1, op, ": db ", db.shape.str(), " has an empty dimension");
  const int64_t rows = a.dim(0) < dc.dim(0) ? a.dim(0) : dc.dim(0);
  check_offsets(expert_offsets, E, rows, op);

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

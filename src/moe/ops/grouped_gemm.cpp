#include "moe/ops/grouped_gemm.h"

#include "moe/ops/cpu/grouped_gemm.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/grouped_gemm.h")
#include "moe/ops/cuda/grouped_gemm.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

namespace {

struct Operand {
  const char* name;
  const Tensor& t;
  int ndim;
};

// The two inputs x, y share the call's dtype T; the output is T or F32; each has its rank.
void check_operands(const OpCheck& check, const Operand& out, const Operand& x, const Operand& y) {
  const DType T = check.compute_dtype(x.name, x.t);
  check.same_dtype(y.name, y.t, x.name, x.t);
  check.output_dtype(out.name, out.t, T);
  for (const Operand* o : {&out, &x, &y}) check.ndim(o->name, o->t, o->ndim);
}

}  // namespace

void grouped_matmul(Tensor c, Tensor a, Tensor b, Tensor expert_offsets, bool trans_b, bool accumulate, Stream stream) {
  const OpCheck check("grouped_matmul", c.device);
  const char* op = check.op();
  check_operands(check, {"c", c, 2}, {"a", a, 2}, {"b", b, 3});
  const int64_t k_in = a.dim(1);
  const int64_t n_out = trans_b ? b.dim(1) : b.dim(2);
  const int64_t b_k = trans_b ? b.dim(2) : b.dim(1);
  MOE_CHECK(b_k == k_in, op, ": b ", b.shape.str(), (trans_b ? " (trans_b)" : ""), " does not match a ", a.shape.str(),
            " in the inner dimension");
  MOE_CHECK(c.dim(1) == n_out, op, ": c has ", c.dim(1), " columns, expected ", n_out, " from b ", b.shape.str());
  MOE_CHECK(k_in >= 1 && n_out >= 1, op, ": empty inner or output dimension (a ", a.shape.str(), ", b ", b.shape.str(),
            ")");
  check.expert_offsets(expert_offsets, b.dim(0), a.dim(0) < c.dim(0) ? a.dim(0) : c.dim(0));
  MOE_OP_DISPATCH(c.device, grouped_matmul, c, a, b, expert_offsets, trans_b, accumulate, stream);
}

void grouped_matmul_wgrad(Tensor db, Tensor dc, Tensor a, Tensor expert_offsets, Stream stream, bool accumulate) {
  const OpCheck check("grouped_matmul_wgrad", db.device);
  const char* op = check.op();
  check_operands(check, {"db", db, 3}, {"dc", dc, 2}, {"a", a, 2});
  const int64_t n_out = db.dim(1), k_in = db.dim(2);
  MOE_CHECK(dc.dim(1) == n_out, op, ": dc has ", dc.dim(1), " columns, expected ", n_out, " from db ", db.shape.str());
  MOE_CHECK(a.dim(1) == k_in, op, ": a has ", a.dim(1), " columns, expected ", k_in, " from db ", db.shape.str());
  MOE_CHECK(k_in >= 1 && n_out >= 1, op, ": db ", db.shape.str(), " has an empty dimension");
  check.expert_offsets(expert_offsets, db.dim(0), a.dim(0) < dc.dim(0) ? a.dim(0) : dc.dim(0));
  MOE_OP_DISPATCH(db.device, grouped_matmul_wgrad, db, dc, a, expert_offsets, stream, accumulate);
}

}  // namespace moe

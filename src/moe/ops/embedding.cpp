#include "moe/ops/embedding.h"

#include "moe/ops/cpu/embedding.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/embedding.h")
#include "moe/ops/cuda/embedding.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

namespace {

// What the lookup and its gradient share (dtypes aside): tokens I32 [R], a [V, D] table and [R, D]
// rows; where the host can read them, ids in [0, V) (an O(R) pass that turns a bad id into an error
// instead of a wild memory access).
void check_lookup(const OpCheck& check, const char* rows_name, const Tensor& rows, const char* table_name,
                  const Tensor& table, const Tensor& tokens) {
  const char* op = check.op();
  check.tensor("tokens", tokens, DType::I32);
  MOE_CHECK(table.ndim() == 2, op, ": ", table_name, " must be 2-D [V, D], got ", table.shape.str());
  MOE_CHECK(rows.ndim() == 2 && rows.dim(0) == tokens.numel() && rows.dim(1) == table.dim(1), op, ": ", rows_name,
            " ", rows.shape.str(), " must be [R, D] = [", tokens.numel(), ", ", table.dim(1), "]");
  if (check.host_data()) check.values_in("tokens", tokens, 0, table.dim(0), "a row of the table");
}

}  // namespace

void embedding_forward(Tensor out, Tensor table, Tensor tokens, Stream stream) {
  const OpCheck check("embedding_forward", table.device);
  check.compute_dtype("table", table);
  check.same_dtype("out", out, "table", table);
  check_lookup(check, "out", out, "table", table, tokens);
  MOE_OP_DISPATCH(table.device, embedding_forward, out, table, tokens, stream);
}

void embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Stream stream) {
  const OpCheck check("embedding_backward", dtable.device);
  check.compute_dtype("dout", dout);
  check.tensor("dtable", dtable, DType::F32, "an FP32 gradient accumulator");
  check_lookup(check, "dout", dout, "dtable", dtable, tokens);
  MOE_OP_DISPATCH(dtable.device, embedding_backward, dtable, dout, tokens, stream);
}

}  // namespace moe

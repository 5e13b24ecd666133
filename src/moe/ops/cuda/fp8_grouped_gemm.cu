// CUDA FP8 expert products (moe/ops/fp8.h): CUTLASS's Hopper ptr-array grouped GEMM with
// blockwise scaling (fp8_grouped_gemm_cutlass.h). There is no fallback kernel: without the CUTLASS
// headers or on a GPU other than Hopper (sm_90) the calls fail with the reason.
//
// ops/fp8.cpp checks the op contract (dtypes, shapes, tiles, scale shapes, db F32, dc_t and x_t
// with the same columns); here the host checks what the CUTLASS kernels need beyond it, each with
// an error naming the tensor and the fix:
//   - c BF16 (the op also allows F32 on the GPU; the kernel writes BF16);
//   - TMA: every row 16-byte aligned and 16-byte aligned base pointers. Codes: k_in % 16 == 0 for
//     the products, columns (Mp) % 16 == 0 for the weight gradient; outputs: n_out % 8 == 0 (BF16
//     c), k_in % 4 == 0 (F32 db);
//   - at most kMaxGroups (1024) experts per call and every dim below 2^31 (CUTLASS's int shapes).
// Partial scale tiles (dims not multiples of 128) are allowed: the kernels read ceil(dim / 128)
// scales as moe/ops/fp8.h lays them out.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/fp8.h"
#if defined(MOE_HAVE_CUTLASS)
#include "moe/ops/cuda/cutlass_scratch.h"
#include "moe/ops/cuda/fp8_grouped_gemm_cutlass.h"
#include "moe/ops/cuda/fp8_grouped_gemm_sm90.h"
#endif

namespace moe::cuda {
namespace {

#if defined(MOE_HAVE_CUTLASS)
void prepare_fp8_kernels() {
  cutlass_grouped::prepare_fp8_nt_bf16();
  cutlass_grouped::prepare_fp8_wgrad_f32();
  sm90_fp8::prepare_fp8_nt_bf16();
}

// MOE_FP8_NT_KERNEL=sm90 runs the forward and data-gradient products on our own SM90 kernel
// (fp8_grouped_gemm_sm90.h) instead of CUTLASS's, for measuring the two against each other (read
// at every call, so one test process checks both; a captured graph keeps the kernel it captured).
bool use_sm90_nt_kernel() { return sm90_fp8::env_switch("MOE_FP8_NT_KERNEL", "cutlass", "sm90"); }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check_aligned(const char* op, const char* name, const Tensor& t) {
  MOE_CHECK(aligned16(t.data), op, ": ", name,
            " is not 16-byte aligned (the CUTLASS kernels load it with TMA); "
            "allocate it at a 16-byte boundary");
}

void check_int_dim(const char* op, const char* name, int64_t v) {
  MOE_CHECK(v <= std::numeric_limits<int32_t>::max(), op, ": ", name, " = ", v,
            " exceeds 2^31 - 1 (CUTLASS's problem shapes are int)");
}

void check_groups(const char* op, int64_t E) {
  MOE_CHECK(E <= cutlass_grouped::kMaxGroups, op, ": ", E, " experts exceed the ", cutlass_grouped::kMaxGroups,
            " one call supports; split the experts over several calls");
}

const cutlass_grouped::Scratch& hopper_scratch(cudaStream_t stream, const char* op) {
  const cutlass_grouped::Scratch* scratch = cutlass_scratch(stream, op, prepare_fp8_kernels);
  MOE_CHECK(scratch != nullptr, op,
            ": the FP8 expert products run on Hopper (sm_90) tensor cores only; "
            "this GPU is not sm_90 (use train.precision = \"bf16\")");
  return *scratch;
}

cutlass_grouped::Fp8Operand operand(const Fp8Tensor& t) {
  return {t.codes.data, static_cast<const float*>(t.scales.data)};
}
#else
constexpr const char* kNoCutlass =
    ": this build has no CUTLASS headers, which the FP8 expert products need (scripts/setup.sh installs "
    "them into .deps/cutlass; re-run cmake)";
#endif

}  // namespace

void fp8_grouped_matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, Tensor expert_offsets, Stream stream) {
  const char* op = "fp8_grouped_matmul (CUDA)";
#if defined(MOE_HAVE_CUTLASS)
  const int64_t E = b.codes.dim(0), n_out = b.codes.dim(1), k_in = a.codes.dim(1);
  const int64_t rows = a.codes.dim(0) < c.dim(0) ? a.codes.dim(0) : c.dim(0);
  MOE_CHECK(c.dtype == DType::BF16, op, ": c is ", dtype_name(c.dtype), "; the GPU writes FP8 expert products in BF16");
  MOE_CHECK(k_in % 16 == 0, op, ": k_in = ", k_in, " (a ", a.codes.shape.str(),
            ") is not a multiple of 16: TMA needs 16-byte code rows");
  MOE_CHECK(n_out % 8 == 0, op, ": n_out = ", n_out, " (b ", b.codes.shape.str(),
            ") is not a multiple of 8: TMA needs 16-byte BF16 rows of c");
  check_groups(op, E);
  check_int_dim(op, "rows", rows);
  check_int_dim(op, "n_out", n_out);
  check_int_dim(op, "k_in", k_in);
  check_aligned(op, "a.codes", a.codes);
  check_aligned(op, "b.codes", b.codes);
  check_aligned(op, "c", c);
  if (rows == 0 || E == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  const cutlass_grouped::Scratch& scratch = hopper_scratch(s, op);  // checks sm_90, prepares both kernels
  const auto* offsets = static_cast<const int32_t*>(expert_offsets.data);
  if (use_sm90_nt_kernel())
    sm90_fp8::fp8_matmul_nt_bf16(c.data, operand(a), operand(b), offsets, static_cast<int>(E), rows,
                                 static_cast<int>(n_out), static_cast<int>(k_in), s);
  else
    cutlass_grouped::fp8_matmul_nt_bf16(c.data, operand(a), operand(b), offsets, static_cast<int>(E), rows,
                                        static_cast<int>(n_out), static_cast<int>(k_in), scratch, s);
#else
  (void)c, (void)a, (void)b, (void)expert_offsets, (void)stream;
  MOE_FAIL(op, kNoCutlass);
#endif
}

void fp8_grouped_matmul_wgrad(Tensor db, Fp8Tensor dc_t, Fp8Tensor x_t, Tensor expert_offsets, bool accumulate,
                              Stream stream) {
  const char* op = "fp8_grouped_matmul_wgrad (CUDA)";
#if defined(MOE_HAVE_CUTLASS)
  const int64_t E = db.dim(0), n_out = db.dim(1), k_in = db.dim(2), columns = x_t.codes.dim(1);
  MOE_CHECK(columns % 16 == 0, op, ": the columns operands have ", columns,
            " columns, not a multiple of 16: TMA needs 16-byte code rows (fp8_columns_capacity is a multiple of 128)");
  MOE_CHECK(k_in % 4 == 0, op, ": k_in = ", k_in, " (db ", db.shape.str(),
            ") is not a multiple of 4: TMA needs 16-byte F32 rows of db");
  check_groups(op, E);
  check_int_dim(op, "columns", columns);
  check_int_dim(op, "n_out", n_out);
  check_int_dim(op, "k_in", k_in);
  check_aligned(op, "dc_t.codes", dc_t.codes);
  check_aligned(op, "x_t.codes", x_t.codes);
  check_aligned(op, "db", db);
  if (E == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (columns == 0) {  // no rows at all: every expert is empty
    if (!accumulate && db.nbytes() > 0) CUDA_CHECK(cudaMemsetAsync(db.data, 0, db.nbytes(), s));
    return;
  }
  cutlass_grouped::fp8_wgrad_f32(static_cast<float*>(db.data), operand(dc_t), operand(x_t),
                                 static_cast<const int32_t*>(expert_offsets.data), static_cast<int>(E), columns,
                                 static_cast<int>(n_out), static_cast<int>(k_in), accumulate, hopper_scratch(s, op), s);
#else
  (void)db, (void)dc_t, (void)x_t, (void)expert_offsets, (void)accumulate, (void)stream;
  MOE_FAIL(op, kNoCutlass);
#endif
}

}  // namespace moe::cuda

// CUDA matmul: one cublasLtMatmul per call on row-major matrices, with descriptors and the
// heuristic's algorithm cached per problem. Row-major products are handed to column-major
// cuBLASLt by swapping operands: C = op(a) op(b) (row-major) is C^T = op(b)^T op(a)^T, and a
// row-major [r, c] matrix read column-major is its [c, r] transpose, with the same leading dim.
#include "moe/ops/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <map>
#include <mutex>
#include <unordered_map>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/element.cuh"

namespace moe::cuda {
namespace {

cudaDataType_t cuda_data_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    default: break;
  }
  MOE_FAIL("matmul: dtype ", dtype_name(t), " is not supported (F32 or BF16)");
}

// Largest power of two (up to cuBLASLt's default assumption of 256) that divides the address.
uint32_t pointer_alignment(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && u % align != 0) align >>= 1;
  return align;
}

void check_not_capturing(cudaStream_t stream, const char* what) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  MOE_CHECK(status == cudaStreamCaptureStatusNone, "matmul: the ", what,
            " would be created during CUDA graph capture (it allocates device memory); run one eager call on this "
            "stream (e.g. an eager first step) before capturing");
}

// Everything cuBLASLt needs for one problem, built once: descriptors and the chosen algorithm.
struct MatmulPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr;  // cuBLASLt's A: our b
  cublasLtMatrixLayout_t b_layout = nullptr;  // cuBLASLt's B: our a
  cublasLtMatrixLayout_t c_layout = nullptr;  // C and D (in place)
  cublasLtMatmulAlgo_t algo{};
};

// M, N, K, trans_a, trans_b, input dtype, c dtype, lda, ldb, ldc, alignment of a, alignment of b,
// (alignment of c) * 2 + (beta != 0).
using PlanKey = std::array<int64_t, 13>;

// The process-wide cuBLASLt state: handle, per-stream workspaces, plan cache. Never destroyed
// (it would run after the CUDA context is gone at exit); the driver frees it with the process.
class CublasLtContext {
 public:
  static CublasLtContext& get() {
    static CublasLtContext* context = new CublasLtContext();
    return *context;
  }

  cublasLtHandle_t handle(cudaStream_t stream) {
    int device = -1;
    CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mutex_);
    if (handle_ == nullptr) {
      check_not_capturing(stream, "cuBLASLt handle");
      CUBLASLT_CHECK(cublasLtCreate(&handle_));
      device_ = device;
    }
    MOE_CHECK(device == device_, "matmul: the cuBLASLt context belongs to device ", device_,
              " but device ", device, " is current (one GPU per process)");
    return handle_;
  }

  StreamWorkspace workspace(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = workspaces_.find(stream);
    if (it != workspaces_.end()) return it->second;
    check_not_capturing(stream, "stream workspace");
    void* base = nullptr;
    CUDA_CHECK(cudaMalloc(&base, kCublasWorkspaceBytes + kStreamScratchBytes));
    StreamWorkspace ws;
    ws.cublas = base;
    ws.scratch = static_cast<char*>(base) + kCublasWorkspaceBytes;
    workspaces_.emplace(stream, ws);
    return ws;
  }

  // The cached plan for key, built on first sight (host-only work: allowed during capture).
  const MatmulPlan& plan(const PlanKey& key, cublasLtHandle_t handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    const int64_t M = key[0], N = key[1], K = key[2];
    const bool trans_a = key[3] != 0, trans_b = key[4] != 0;
    const cudaDataType_t in_type = cuda_data_type(static_cast<DType>(key[5]));
    const cudaDataType_t c_type = cuda_data_type(static_cast<DType>(key[6]));
    const int64_t lda = key[7], ldb = key[8], ldc = key[9];
    MatmulPlan p;
    CUBLASLT_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our b
    const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B is our a
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    // Column-major views of the row-major storage: [rows, cols] row-major is [cols, rows] column-major.
    const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;  // our b, row-major
    const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;  // our a, row-major
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&p.a_layout, in_type, static_cast<uint64_t>(b_cols),
                                              static_cast<uint64_t>(b_rows), ldb));
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&p.b_layout, in_type, static_cast<uint64_t>(a_cols),
                                              static_cast<uint64_t>(a_rows), lda));
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&p.c_layout, c_type, static_cast<uint64_t>(N), static_cast<uint64_t>(M),
                                              ldc));

    cublasLtMatmulPreference_t pref = nullptr;
    CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t max_workspace = kCublasWorkspaceBytes;
    CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                                        sizeof(max_workspace)));
    // cuBLASLt assumes 256-byte aligned buffers unless told otherwise; sub-views (row ranges,
    // chunks) are often less aligned, and an algorithm chosen for 256 would read them wrongly.
    const uint32_t align_a = static_cast<uint32_t>(key[10]), align_b = static_cast<uint32_t>(key[11]),
                   align_c = static_cast<uint32_t>(key[12] >> 1);
    CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_b,
                                                        sizeof(align_b)));
    CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_a,
                                                        sizeof(align_a)));
    CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                        sizeof(align_c)));
    CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                        sizeof(align_c)));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a_layout, p.b_layout, p.c_layout,
                                                             p.c_layout, pref, 1, &result, &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    MOE_CHECK(rc == CUBLAS_STATUS_SUCCESS && returned > 0, "matmul: cuBLASLt found no algorithm for M=", M, " N=", N,
              " K=", K, " trans_a=", trans_a, " trans_b=", trans_b, " input ", dtype_name(static_cast<DType>(key[5])),
              " output ", dtype_name(static_cast<DType>(key[6])), " (lda ", lda, ", ldb ", ldb, ", ldc ", ldc,
              ", alignments ", align_a, "/", align_b, "/", align_c, "): ", cublasLtGetStatusName(rc));
    p.algo = result.algo;
    return plans_.emplace(key, p).first->second;
  }

 private:
  CublasLtContext() = default;
  std::mutex mutex_;
  cublasLtHandle_t handle_ = nullptr;
  int device_ = -1;
  std::unordered_map<cudaStream_t, StreamWorkspace> workspaces_;
  std::map<PlanKey, MatmulPlan> plans_;
};

// K = 0: c = beta * c over an [M, N] matrix with leading dim ld; beta = 0 writes zeros (even over NaN).
template <typename T>
__global__ void scale_matrix_kernel(T* c, int64_t M, int64_t N, int64_t ld, float beta) {
  const int64_t total = M * N;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T* p = c + (i / N) * ld + i % N;
    *p = beta == 0.0f ? from_f32<T>(0.0f) : from_f32<T>(beta * to_f32(*p));
  }
}

void scale_matrix(const MatrixView& c, float beta, cudaStream_t stream) {
  const int64_t total = c.rows * c.cols;
  const int threads = 256;
  const int64_t blocks = (total + threads - 1) / threads < 4096 ? (total + threads - 1) / threads : 4096;
  if (c.dtype == DType::F32) {
    scale_matrix_kernel<float><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        static_cast<float*>(c.data), c.rows, c.cols, c.ld, beta);
  } else {
    scale_matrix_kernel<__nv_bfloat16><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        static_cast<__nv_bfloat16*>(c.data), c.rows, c.cols, c.ld, beta);
  }
  CUDA_CHECK_LAUNCH();
}

MatrixView as_view(const Tensor& t) {
  MatrixView v;
  v.data = t.data;
  v.dtype = t.dtype;
  v.cols = t.dim(-1);
  v.rows = 1;
  for (int i = 0; i + 1 < t.ndim(); ++i) v.rows *= t.dim(i);  // leading dims fold into rows
  v.ld = v.cols > 1 ? v.cols : 1;
  return v;
}

}  // namespace

StreamWorkspace stream_workspace(Stream stream) {
  return CublasLtContext::get().workspace(cuda_stream(stream));
}

void matmul_view(MatrixView c, MatrixView a, MatrixView b, bool trans_a, bool trans_b, float alpha, float beta,
                 Stream stream) {
  const int64_t M = c.rows, N = c.cols;
  const int64_t K = trans_a ? a.rows : a.cols;
  const int64_t a_m = trans_a ? a.cols : a.rows;
  const int64_t b_k = trans_b ? b.cols : b.rows;
  const int64_t b_n = trans_b ? b.rows : b.cols;
  MOE_CHECK(a_m == M && b_k == K && b_n == N, "matmul: shapes do not agree: c [", c.rows, ", ", c.cols, "], a [",
            a.rows, ", ", a.cols, "]", (trans_a ? " (transposed)" : ""), ", b [", b.rows, ", ", b.cols, "]",
            (trans_b ? " (transposed)" : ""));
  MOE_CHECK(a.dtype == b.dtype && (a.dtype == DType::F32 || a.dtype == DType::BF16), "matmul: a (",
            dtype_name(a.dtype), ") and b (", dtype_name(b.dtype), ") must share one dtype, F32 or BF16");
  MOE_CHECK(c.dtype == a.dtype || c.dtype == DType::F32, "matmul: c has dtype ", dtype_name(c.dtype),
            ", expected ", dtype_name(a.dtype), " or F32");
  for (const MatrixView* v : {&a, &b, &c})
    MOE_CHECK(v->ld >= v->cols && v->ld >= 1, "matmul: leading dim ", v->ld, " is below the ", v->cols, " columns");
  constexpr int64_t kIntMax = 2147483647;
  MOE_CHECK(M <= kIntMax && N <= kIntMax && K <= kIntMax, "matmul: dimensions M=", M, " N=", N, " K=", K,
            " exceed the int range");
  if (M == 0 || N == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (K == 0) {  // empty sum: c = beta * c
    scale_matrix(c, beta, s);
    return;
  }
  CublasLtContext& context = CublasLtContext::get();
  const cublasLtHandle_t handle = context.handle(s);
  const StreamWorkspace ws = context.workspace(s);
  const PlanKey key = {M, N, K, trans_a ? 1 : 0, trans_b ? 1 : 0, static_cast<int64_t>(a.dtype),
                       static_cast<int64_t>(c.dtype), a.ld, b.ld, c.ld, pointer_alignment(a.data),
                       pointer_alignment(b.data),
                       (static_cast<int64_t>(pointer_alignment(c.data)) << 1) | (beta != 0.0f ? 1 : 0)};
  const MatmulPlan& p = context.plan(key, handle);
  CUBLASLT_CHECK(cublasLtMatmul(handle, p.desc, &alpha, b.data, p.a_layout, a.data, p.b_layout, &beta, c.data,
                                p.c_layout, c.data, p.c_layout, &p.algo, ws.cublas, kCublasWorkspaceBytes,
                                s));
}

void matmul(Tensor c, Tensor a, Tensor b, bool trans_a, bool trans_b, float alpha, float beta, Stream stream) {
  matmul_view(as_view(c), as_view(a), as_view(b), trans_a, trans_b, alpha, beta, stream);
}

}  // namespace moe::cuda

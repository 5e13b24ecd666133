// CUDA FP8 dense product fp8_matmul (moe/ops/fp8.h): one cuBLASLt block-scaled FP8 matmul per call
// (Hopper, cuBLAS >= 12.9), descriptors and the heuristic's algorithm cached per problem as in
// gemm.cu, the per-stream cuBLASLt workspace of gemm.h.
//
// The product c [M, N] = a [M, K] b [N, K]^T (both operands K-contiguous) is the "TN" form FP8
// needs on Hopper: read column-major, b is cuBLAS's A = [K, N] with op T and a is cuBLAS's B =
// [K, M] with op N, giving C^T = c (row-major [M, N] = column-major [N, M], ld N). a's Rows tiles
// are cuBLAS's VEC128_32F (one FP32 scale per 128 K-elements of a row); b's Blocks tiles are
// BLK128x128_32F and b's Rows or Columns tiles (the weight gradient's columns operands) VEC128_32F. cuBLAS
// multiplies the E4M3 codes with FP32 accumulation and applies the two scales once per 128-deep
// slice of K (the DeepSeek-V3 promotion); it refuses FP8 fast accumulation with these modes, so
// CUBLASLT_MATMUL_DESC_FAST_ACCUM stays 0. D is BF16 or F32 (C = D in place, beta = 1 to
// accumulate: supported for both).
//
// NOTES: cuBLAS's scale layouts differ from ours (moe/ops/fp8.h); as NVIDIA's TransformerEngine
// writes them for cuBLAS ("GEMM-ready"), for an operand [R, K]:
//   VEC128_32F:      scales [ceil(K / 128), round_up(R, 4)], R fastest (ours: [R, ceil(K / 128)]);
//   BLK128x128_32F:  scales [ceil(R / 128), round_up(ceil(K / 128), 4)], K tiles fastest (ours: the
//                    same without the padding, equal when ceil(K / 128) % 4 == 0).
//   Columns tiles:   scales [ceil(K / 128), R], R fastest: VEC128_32F's layout when R % 4 == 0
//                    (always here: R % 8 == 0).
// So each call first restages the Rows and Blocks operands' scales into a per-stream device buffer
// in cuBLAS's layout: one small kernel (M ceil(K/128) + N ceil(K/128) floats, e.g. 96 K floats for
// M = 4096, N = 1024, K = 2048: about 1 us), then the matmul. The forward's and the data gradient's
// Rows tiles keep K tiles fastest because the expert products read them so (an expert's rows are a
// contiguous range of scale rows, and CUTLASS's forward ran 1.5% slower on M-major scales, bench/
// RESULTS.md, thirty-second session). Columns operands (the weight gradient's both) are passed as
// they are, 16-byte aligned scales allowed; the weight gradient restages nothing.
// The staging buffer is created at the first call of a stream and grows (never during a CUDA graph
// capture, which fails with a clear error instead; the step's eager first run sizes it) by
// replacement; a replaced buffer is kept, since a captured graph may still read it.
//
// Requirements (cuBLASLt's for block-scaled FP8 on SM90, as TransformerEngine enforces them):
// K % 16 == 0 (16-byte leading dims of the FP8 operands), M % 8 == 0 and N % 8 == 0 (the 1D-scaled
// operands' outer dims), 16-byte aligned code and output pointers; refused with a clear error.
//
// Scale pointers are matmul-descriptor attributes: every call sets them on the cached descriptor
// and calls cublasLtMatmul under the context's lock (host-only work, so capturable).
#include "moe/ops/cuda/fp8.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/gemm.h"

namespace moe::cuda {
namespace {

constexpr int64_t kTile = kFp8Tile;
constexpr size_t kMinCublasVersion = 120900;  // VEC128_32F and BLK128x128_32F came with cuBLAS 12.9

int64_t tiles(int64_t n) { return (n + kTile - 1) / kTile; }
int64_t round_up4(int64_t n) { return (n + 3) / 4 * 4; }
int64_t round_up256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Largest power of two (up to cuBLASLt's default assumption of 256) that divides the address.
uint32_t pointer_alignment(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && u % align != 0) align >>= 1;
  return align;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// An operand's scales as cuBLAS reads them: restaged into `elements` of the staging buffer, or,
// with elements = 0, read where they are (see NOTES above).
struct StagedScales {
  Fp8Tiles tiles = Fp8Tiles::Rows;
  int64_t rows = 0;  // R of the operand [R, K]
  int64_t elements = 0;
  int64_t bytes() const { return round_up256(elements * 4); }
};

// VEC128_32F of [R, K] (ours [R, kt]; Columns [kt, R] as it is when 16-byte aligned, else copied)
// or BLK128x128_32F of [R, K] (ours [ceil(R/128), kt]).
StagedScales staged_scales(const Fp8Tensor& t) {
  const int64_t R = t.codes.dim(0), kt = tiles(t.codes.dim(1));
  if (t.tiles == Fp8Tiles::Blocks) return {t.tiles, R, tiles(R) * round_up4(kt)};
  if (t.tiles == Fp8Tiles::Columns && pointer_alignment(t.scales.data) >= 16) return {t.tiles, R, 0};
  return {t.tiles, R, kt * round_up4(R)};
}

// Element i of an operand's staged scales (cuBLAS's layout) from ours: Rows [R, kt] -> [kt,
// round_up4(R)]; Columns [kt, R] -> [kt, round_up4(R)]; Blocks [nt, kt] -> [nt, round_up4(kt)].
// Padding is 0 (cuBLAS never reads it here since M and N are multiples of 8).
__device__ __forceinline__ float staged_scale(const float* ours, Fp8Tiles tiles, int64_t R, int64_t kt, int64_t i) {
  const int64_t ld = tiles == Fp8Tiles::Blocks ? (kt + 3) / 4 * 4 : (R + 3) / 4 * 4;
  const int64_t outer = i / ld, inner = i - outer * ld;
  if (tiles == Fp8Tiles::Blocks) return inner < kt ? ours[outer * kt + inner] : 0.0f;
  if (inner >= R) return 0.0f;
  return tiles == Fp8Tiles::Columns ? ours[outer * R + inner] : ours[inner * kt + outer];
}

// Both operands' staged scales, one thread per staged element.
__global__ void stage_scales_kernel(const float* a, float* a_staged, StagedScales a_layout, const float* b,
                                    float* b_staged, StagedScales b_layout, int64_t kt) {
  const int64_t a_total = a_layout.elements, total = a_total + b_layout.elements;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < a_total)
      a_staged[i] = staged_scale(a, a_layout.tiles, a_layout.rows, kt, i);
    else
      b_staged[i - a_total] = staged_scale(b, b_layout.tiles, b_layout.rows, kt, i - a_total);
  }
}

// Everything cuBLASLt needs for one problem, built once: descriptors and the chosen algorithm.
struct Fp8Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr;  // cuBLASLt's A: our b
  cublasLtMatrixLayout_t b_layout = nullptr;  // cuBLASLt's B: our a
  cublasLtMatrixLayout_t c_layout = nullptr;  // C and D (in place)
  cublasLtMatmulAlgo_t algo{};
};

// M, N, K, b's tiles, c's dtype, accumulate, alignments of a's codes, b's codes and c.
using Fp8PlanKey = std::array<int64_t, 9>;

// The process-wide state of the FP8 products: a cuBLASLt handle, per-stream scale staging buffers,
// the plan cache. Never destroyed (it would run after the CUDA context is gone at exit).
class Fp8MatmulContext {
 public:
  static Fp8MatmulContext& get() {
    static Fp8MatmulContext* context = new Fp8MatmulContext();
    return *context;
  }

  std::mutex& mutex() { return mutex_; }

  // Callers hold mutex().
  cublasLtHandle_t handle(cudaStream_t stream) {
    int device = -1;
    CUDA_CHECK(cudaGetDevice(&device));
    if (handle_ == nullptr) {
      const size_t version = cublasLtGetVersion();
      MOE_CHECK(version >= kMinCublasVersion, "fp8_matmul: cuBLASLt ", version,
                " has no block-scaled FP8 matmul (VEC128_32F / BLK128x128_32F scales need cuBLAS 12.9 or newer)");
      MOE_CHECK(!capturing(stream), "fp8_matmul: the cuBLASLt handle would be created during CUDA graph capture; run "
                                    "one eager call on this stream (e.g. an eager first step) before capturing");
      CUBLASLT_CHECK(cublasLtCreate(&handle_));
      device_ = device;
    }
    MOE_CHECK(device == device_, "fp8_matmul: the cuBLASLt context belongs to device ", device_, " but device ",
              device, " is current (one GPU per process)");
    return handle_;
  }

  // A device buffer of at least `bytes` for this stream's staged scales (256-byte aligned).
  // Callers hold mutex().
  float* staging(cudaStream_t stream, int64_t bytes) {
    Staging& s = staging_[stream];
    if (s.bytes >= bytes) return s.buffer;
    MOE_CHECK(!capturing(stream), "fp8_matmul: the scale staging buffer of this stream must grow to ", bytes,
              " bytes during CUDA graph capture (it allocates device memory); run one eager call with the largest "
              "shapes on this stream (e.g. an eager first step) before capturing");
    const int64_t grown = bytes > 2 * s.bytes ? bytes : 2 * s.bytes;
    void* buffer = nullptr;
    CUDA_CHECK(cudaMalloc(&buffer, static_cast<size_t>(grown)));
    if (s.buffer != nullptr) retired_.push_back(s.buffer);  // a captured graph may still read it
    s.buffer = static_cast<float*>(buffer);
    s.bytes = grown;
    return s.buffer;
  }

  // The cached plan for key, built on first sight (host-only work: allowed during capture). The
  // scale pointers set here are placeholders; every call sets its own. Callers hold mutex().
  const Fp8Plan& plan(const Fp8PlanKey& key, cublasLtHandle_t handle, const void* a_scales, const void* b_scales) {
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    const int64_t M = key[0], N = key[1], K = key[2];
    const bool b_blocks = static_cast<Fp8Tiles>(key[3]) == Fp8Tiles::Blocks;
    const DType c_dtype = static_cast<DType>(key[4]);
    const bool accumulate = key[5] != 0;
    const cudaDataType_t c_type = c_dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    Fp8Plan p;
    CUBLASLT_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = CUBLAS_OP_T, op_b = CUBLAS_OP_N;
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    const int32_t mode_a =
        b_blocks ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const int32_t mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a)));
    CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)));
    set_scale_pointers(p, a_scales, b_scales);
    // Column-major views of the row-major storage: b [N, K] is [K, N] (ld K), a [M, K] is [K, M].
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&p.a_layout, CUDA_R_8F_E4M3, static_cast<uint64_t>(K),
                                              static_cast<uint64_t>(N), K));
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&p.b_layout, CUDA_R_8F_E4M3, static_cast<uint64_t>(K),
                                              static_cast<uint64_t>(M), K));
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&p.c_layout, c_type, static_cast<uint64_t>(N), static_cast<uint64_t>(M),
                                              N));

    cublasLtMatmulPreference_t pref = nullptr;
    CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t max_workspace = kCublasWorkspaceBytes;
    CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                                        sizeof(max_workspace)));
    // cuBLASLt assumes 256-byte aligned buffers unless told otherwise (row-range views are less).
    const uint32_t align_a = static_cast<uint32_t>(key[6]), align_b = static_cast<uint32_t>(key[7]),
                   align_c = static_cast<uint32_t>(key[8]);
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
    if (rc != CUBLAS_STATUS_SUCCESS || returned == 0) {
      destroy(p);
      MOE_FAIL("fp8_matmul: cuBLASLt found no block-scaled FP8 algorithm for M=", M, " N=", N, " K=", K,
               " (a 1 x 128, b ", b_blocks ? "128 x 128" : "1 x 128", ", c ", dtype_name(c_dtype),
               accumulate ? ", accumulating" : "", ", alignments a/b/c ", align_a, "/", align_b, "/", align_c,
               "): ", cublasLtGetStatusName(rc), " (block-scaled FP8 runs on Hopper, sm_90, only)");
    }
    p.algo = result.algo;
    return plans_.emplace(key, p).first->second;
  }

  static void set_scale_pointers(const Fp8Plan& p, const void* a_scales, const void* b_scales) {
    // cuBLASLt's A is our b, its B our a.
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scales,
                                                  sizeof(b_scales)));
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scales,
                                                  sizeof(a_scales)));
  }

 private:
  struct Staging {
    float* buffer = nullptr;
    int64_t bytes = 0;
  };

  static void destroy(Fp8Plan& p) {
    if (p.c_layout) cublasLtMatrixLayoutDestroy(p.c_layout);
    if (p.b_layout) cublasLtMatrixLayoutDestroy(p.b_layout);
    if (p.a_layout) cublasLtMatrixLayoutDestroy(p.a_layout);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  }

  Fp8MatmulContext() = default;
  std::mutex mutex_;
  cublasLtHandle_t handle_ = nullptr;
  int device_ = -1;
  std::unordered_map<cudaStream_t, Staging> staging_;
  std::vector<float*> retired_;
  std::map<Fp8PlanKey, Fp8Plan> plans_;
};

}  // namespace

void fp8_matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, bool accumulate, Stream stream) {
  const int64_t M = a.codes.dim(0), K = a.codes.dim(1), N = b.codes.dim(0);
  const cudaStream_t s = cuda_stream(stream);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // empty sum: c = 0, or c unchanged when accumulating
    if (!accumulate) CUDA_CHECK(cudaMemsetAsync(c.data, 0, c.nbytes(), s));
    return;
  }
  MOE_CHECK(K % 16 == 0 && M % 8 == 0 && N % 8 == 0,
            "fp8_matmul: cuBLASLt's block-scaled FP8 matmul needs K % 16 == 0, M % 8 == 0 and N % 8 == 0; got M=", M,
            " N=", N, " K=", K, " (a.codes ", a.codes.shape.str(), ", b.codes ", b.codes.shape.str(),
            "): pad the dims");
  const auto check_aligned = [](const char* name, const void* p) {
    MOE_CHECK(pointer_alignment(p) >= 16, "fp8_matmul: ", name, " is not 16-byte aligned (", p,
              "); the FP8 matmul reads and writes 16-byte vectors");
  };
  check_aligned("a.codes", a.codes.data);
  check_aligned("b.codes", b.codes.data);
  check_aligned("c", c.data);
  const StagedScales a_staged = staged_scales(a), b_staged = staged_scales(b);
  const int64_t kt = tiles(K);
  const StreamWorkspace ws = stream_workspace(stream);

  Fp8MatmulContext& context = Fp8MatmulContext::get();
  std::lock_guard<std::mutex> lock(context.mutex());
  const cublasLtHandle_t handle = context.handle(s);
  const int64_t total = a_staged.elements + b_staged.elements;
  float* staging = total > 0 ? context.staging(s, a_staged.bytes() + b_staged.bytes()) : nullptr;
  const float* a_scales = a_staged.elements > 0 ? staging : a.scales.ptr<const float>();
  const float* b_scales = b_staged.elements > 0 ? staging + a_staged.bytes() / 4 : b.scales.ptr<const float>();
  if (total > 0) {
    stage_scales_kernel<<<static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 1024)), 256, 0, s>>>(
        a.scales.ptr<const float>(), staging, a_staged, b.scales.ptr<const float>(), staging + a_staged.bytes() / 4,
        b_staged, kt);
    CUDA_CHECK_LAUNCH();
  }

  const Fp8PlanKey key = {M,
                          N,
                          K,
                          static_cast<int64_t>(b.tiles),
                          static_cast<int64_t>(c.dtype),
                          accumulate ? 1 : 0,
                          pointer_alignment(a.codes.data),
                          pointer_alignment(b.codes.data),
                          pointer_alignment(c.data)};
  const Fp8Plan& p = context.plan(key, handle, a_scales, b_scales);
  Fp8MatmulContext::set_scale_pointers(p, a_scales, b_scales);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  CUBLASLT_CHECK(cublasLtMatmul(handle, p.desc, &alpha, b.codes.data, p.a_layout, a.codes.data, p.b_layout, &beta,
                                c.data, p.c_layout, c.data, p.c_layout, &p.algo, ws.cublas, kCublasWorkspaceBytes,
                                s));
}

}  // namespace moe::cuda

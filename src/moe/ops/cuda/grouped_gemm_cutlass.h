// The BF16 expert products on CUTLASS's Hopper (sm_90a) ptr-array grouped GEMM: the interface
// grouped_gemm.cu dispatches to. Plain declarations only (no CUTLASS types), so grouped_gemm.cu
// compiles without the CUTLASS headers; the kernels live in grouped_gemm_cutlass_{fwd,dgrad,wgrad}.cu
// (one instantiation each, about a minute of nvcc each: a change elsewhere does not rebuild them),
// built only when CMake found the headers (MOE_HAVE_CUTLASS).
//
// Every call first launches a tiny setup kernel on the stream that reads expert_offsets (device)
// and writes the per-expert problem shapes, operand pointers and strides into `scratch`; the
// grouped GEMM then reads them there. No host copy and no synchronization: capturable in a graph.
// The host only checks what it knows (dims, base-pointer alignment); the caller guarantees:
//   - BF16 operands, row-major, every row 16-byte aligned: n_out % 8 == 0 and k_in % 8 == 0, and
//     the base pointers 16-byte aligned (TMA); then a + offsets[e] * k_in stays aligned for any e;
//   - groups <= kMaxGroups, rows, n_out, k_in < 2^31 (CUTLASS's problem shapes are int).
// Offsets are clamped into [0, rows] on the device as in the tiled kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace moe::cuda::cutlass_grouped {

constexpr int kMaxGroups = 1024;  // experts per call; more fall back to the tiled kernels

// Per-stream device memory for the per-group argument arrays and CUTLASS's workspace (the
// tensor maps each SM rewrites per group): kScratchBytes, allocated once outside graph capture.
constexpr size_t kScratchBytes = size_t{2} << 20;

// The three expert products; grouped_gemm_cutlass.cuh's ExpertGemm gives each one's operand layouts.
enum class ExpertProduct { kForward, kDataGrad, kWeightGrad };

struct Scratch {
  void* base = nullptr;  // kScratchBytes, 256-byte aligned
  int device = 0;
  int sm_count = 0;  // persistent grid size
};

// c[o_e:o_{e+1}] (= or +=) a[o_e:o_{e+1}] * b[e]^T: a [rows, k_in], b [E, n_out, k_in], c [rows, n_out].
// BF16 in and out, FP32 accumulation. (Forward: trans_b = true.)
void matmul_nt_bf16(void* c, const void* a, const void* b, const int32_t* offsets, int groups, int64_t rows,
                    int n_out, int k_in, bool accumulate, const Scratch& scratch, cudaStream_t stream);

// c[o_e:o_{e+1}] (= or +=) a[o_e:o_{e+1}] * b[e]: b [E, k_in, n_out]. (Backward data: trans_b = false.)
void matmul_nn_bf16(void* c, const void* a, const void* b, const int32_t* offsets, int groups, int64_t rows,
                    int n_out, int k_in, bool accumulate, const Scratch& scratch, cudaStream_t stream);

// db[e] [n_out, k_in] (+= when accumulate, else =) dc[o_e:o_{e+1}]^T a[o_e:o_{e+1}]: dc [rows, n_out],
// a [rows, k_in] BF16, db F32. Experts with no rows leave db[e] bit-identical, or zero it when
// not accumulating.
void wgrad_bf16_f32(void* db, const void* dc, const void* a, const int32_t* offsets, int groups, int64_t rows,
                    int n_out, int k_in, bool accumulate, const Scratch& scratch, cudaStream_t stream);

// Raises each kernel's dynamic shared-memory limit (cudaFuncSetAttribute). Host-only, but done once
// per process before any capture, together with the first scratch allocation.
void prepare_nt_bf16();
void prepare_nn_bf16();
void prepare_wgrad_bf16_f32();

}  // namespace moe::cuda::cutlass_grouped

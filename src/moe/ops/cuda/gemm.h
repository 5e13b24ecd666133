// CUDA dense matrix products through cuBLASLt. Semantics: moe/ops/gemm.h; ops/gemm.cpp checks the
// arguments of matmul. matmul_view, the entry for views inside larger buffers, checks its own.
//
// Dtypes on the GPU: a and b share T in {F32, BF16}; c is T or F32 (F32 with beta = 1 is how weight
// gradients accumulate into FP32 buffers). Accumulation is FP32 (CUBLAS_COMPUTE_32F: for F32
// inputs no TF32, so F32 results match the CPU to ~1e-5 normalized error).
//
// NOTES: one process-wide cuBLASLt handle, created on first use, serves every call; each stream gets
// its own device workspace (32 MiB for cuBLASLt plus a small scratch, see stream_workspace), also
// created on first use of that stream and kept for the life of the process. Creating them allocates
// device memory, which a CUDA graph capture forbids: the first call on a stream must come before
// any capture (the first eager step does this); a first call during capture fails with a clear
// error. Matmul descriptors and the chosen algorithm are cached by (shapes, leading dims, dtypes,
// transposes, pointer alignments, beta != 0), so repeated calls do no descriptor or heuristic work.
// One GPU per process: the handle belongs to the device current at its creation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe::cuda {

void matmul(Tensor c, Tensor a, Tensor b, bool trans_a, bool trans_b, float alpha, float beta, Stream stream);

// A row-major matrix in device memory whose rows start ld elements apart (ld >= cols), for callers
// that multiply a matrix living inside a larger buffer (the LM head's BF16 logit gradient sits in
// rows sized for F32). matmul() is matmul_view() with ld = cols.
struct MatrixView {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
};

// c = alpha * op(a) * op(b) + beta * c with the dtype rules above; K = 0 gives c = beta * c
// (beta = 0 writes zeros, as BLAS does); M = 0 or N = 0 does nothing.
void matmul_view(MatrixView c, MatrixView a, MatrixView b, bool trans_a, bool trans_b, float alpha, float beta,
                 Stream stream);

// Per-stream device memory owned by the process-wide context. The cuBLASLt workspace belongs to
// matmuls on that stream; the scratch (kStreamScratchBytes, 256-byte aligned) may be used by any op
// on that stream for the duration of one call (stream order serializes the users), never across calls.
inline constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
inline constexpr size_t kStreamScratchBytes = size_t{64} << 10;
struct StreamWorkspace {
  void* cublas = nullptr;
  void* scratch = nullptr;
};
StreamWorkspace stream_workspace(Stream stream);

}  // namespace moe::cuda

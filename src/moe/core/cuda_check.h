// CUDA_CHECK / CUBLASLT_CHECK: turn a failing CUDA or cuBLAS call into moe::Error with the call,
// the error name and file:line. Only in builds with the CUDA backend (MOE_HAVE_CUDA).
#pragma once

#if defined(MOE_HAVE_CUDA)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "moe/core/error.h"
#include "moe/core/stream.h"

#define CUDA_CHECK(call)                                                                             \
  do {                                                                                               \
    const cudaError_t moe_cuda_rc_ = (call);                                                         \
    if (moe_cuda_rc_ != cudaSuccess)                                                                 \
      MOE_FAIL(#call, " failed: ", cudaGetErrorName(moe_cuda_rc_), ": ", cudaGetErrorString(moe_cuda_rc_)); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next call.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// cuBLASLt status names come from cublasLt itself (moe_core links cublasLt, not cublas).
#define CUBLASLT_CHECK(call)                                                                    \
  do {                                                                                          \
    const cublasStatus_t moe_cublas_rc_ = (call);                                               \
    if (moe_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                                \
      MOE_FAIL(#call, " failed: ", cublasLtGetStatusName(moe_cublas_rc_), ": ",                 \
               cublasLtGetStatusString(moe_cublas_rc_));                                        \
  } while (0)

namespace moe {
// The stream every op runs on when its Stream argument is empty: one blocking stream per
// process, created on first use. Not the legacy default stream, because that stream cannot be
// captured into a CUDA graph; blocking, so synchronous copies on the legacy stream outside a step
// stay ordered with the ops.
cudaStream_t compute_stream();
inline cudaStream_t cuda_stream(Stream s) {
  return s.handle != nullptr ? static_cast<cudaStream_t>(s.handle) : compute_stream();
}
}  // namespace moe
#endif

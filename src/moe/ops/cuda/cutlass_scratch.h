// The process-wide state of the CUTLASS grouped GEMMs (BF16: grouped_gemm.cu, FP8:
// fp8_grouped_gemm.cu): whether the current device runs their sm_90a kernels, and one scratch per
// stream (grouped_gemm_cutlass.h's Scratch: the per-group argument arrays and CUTLASS's workspace).
// Calls on one stream run in order, so the BF16 and FP8 products of a stream share its scratch.
// The scratch is allocated on the first eager call on a stream and never freed (it would be freed
// after the CUDA context is gone at exit; the driver frees it with the process), so a CUDA graph
// captures only kernels. Host-only code: no CUTLASS headers.
#pragma once

#include <cuda_runtime.h>

#include "moe/ops/cuda/grouped_gemm_cutlass.h"

namespace moe::cuda {

// Whether the current device runs the sm_90a kernels (host queries only: allowed in capture).
// One GPU per process: a later call on another device fails naming `op`.
bool cutlass_supported(const char* op);

// The stream's scratch, or nullptr when the device cannot run the sm_90a kernels. `prepare`
// raises the dynamic shared-memory limits of a family of kernels (cudaFuncSetAttribute); it runs
// once per process, before the first scratch of that family is handed out. A first call on a
// stream, or a family's first call, inside CUDA graph capture fails naming `op` (it would allocate
// or set attributes during capture): run one eager call first.
const cutlass_grouped::Scratch* cutlass_scratch(cudaStream_t stream, const char* op, void (*prepare)());

}  // namespace moe::cuda

// CUDA grouped (per-expert) matrix products. Semantics: moe/ops/grouped_gemm.h.
//
// Dtypes on the GPU: a and b (grouped_matmul), dc and a (grouped_matmul_wgrad) share T in
// {F32, BF16}; the output (c, db) is T or F32. Accumulation is FP32 in registers; with
// accumulate (and always in wgrad) the output is read, added to in FP32 and rounded once.
//
// Per-expert row ranges come only from the device tensor expert_offsets [E+1] I32: no host copy,
// no synchronization, so the calls can be captured in a CUDA graph. The host cannot check the
// offsets; they must be non-decreasing with offsets[E] <= rows (the route op guarantees this).
// Values outside [0, rows] are clamped on the device so that bad offsets cannot touch memory past
// the buffers (the result is then wrong, but nothing is overwritten).
//
// NOTES: these are plain tiled CUDA-core kernels (64x64 output tiles, shared-memory staging, FP32
// FMA), written to be obviously correct and deterministic. A CUTLASS Hopper ptr-array grouped GEMM
// with device-side problem sizes (WGMMA) replaces them in the speed issue.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe::cuda {

void grouped_matmul(Tensor c, Tensor a, Tensor b, Tensor expert_offsets, bool trans_b, bool accumulate,
                    Stream stream);

void grouped_matmul_wgrad(Tensor db, Tensor dc, Tensor a, Tensor expert_offsets, Stream stream);

}  // namespace moe::cuda

// CUDA grouped (per-expert) matrix products. Semantics: moe/ops/grouped_gemm.h; ops/grouped_gemm.cpp
// checks the arguments (the *_tiled entries below assume the same), the kernels only their own grid
// limits.
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
// Two implementations. BF16 products (BF16 out for grouped_matmul, F32 out for the wgrad) run on
// CUTLASS's Hopper ptr-array grouped GEMM (WGMMA + TMA, grouped_gemm_cutlass.h) when the build found
// the CUTLASS headers (MOE_HAVE_CUTLASS), the GPU is sm_90, n_out and k_in are multiples of 8 and
// the base pointers 16-byte aligned; the first such call on a stream allocates that stream's
// scratch and must not be inside a graph capture. Everything else runs plain tiled CUDA-core
// kernels (64x64 output tiles, shared-memory staging, FP32 FMA), written to be obviously correct;
// the *_tiled entry points always use those (tests and benchmarks compare the two).
// Both are deterministic: every output tile is summed by one CTA in a fixed order.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe::cuda {

void grouped_matmul(Tensor c, Tensor a, Tensor b, Tensor expert_offsets, bool trans_b, bool accumulate,
                    Stream stream);

void grouped_matmul_wgrad(Tensor db, Tensor dc, Tensor a, Tensor expert_offsets, Stream stream, bool accumulate);

// The tiled CUDA-core kernels, whatever the dtypes and dims (same semantics).
void grouped_matmul_tiled(Tensor c, Tensor a, Tensor b, Tensor expert_offsets, bool trans_b, bool accumulate,
                          Stream stream);
void grouped_matmul_wgrad_tiled(Tensor db, Tensor dc, Tensor a, Tensor expert_offsets, Stream stream,
                                bool accumulate = true);

// Whether BF16 products that fit go to CUTLASS here: built with it and the current GPU is sm_90.
bool grouped_gemm_uses_cutlass();

}  // namespace moe::cuda

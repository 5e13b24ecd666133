// The FP8 expert products on CUTLASS's Hopper (sm_90a) ptr-array grouped GEMM with blockwise
// scaling: the interface fp8_grouped_gemm.cu dispatches to. Plain declarations only (no CUTLASS
// types), so fp8_grouped_gemm.cu compiles without the CUTLASS headers; the kernels live in
// fp8_grouped_gemm_cutlass_{nt,wgrad}.cu (one instantiation each), built only when CMake found the
// headers (MOE_HAVE_CUTLASS).
//
// Operands are E4M3 codes with F32 power-of-two scales in the tiles of moe/ops/fp8.h; every
// product contracts over the last, contiguous dim of both operands, which is the only orientation
// Hopper's FP8 tensor cores take (K-major A and B). As with the BF16 products, a setup kernel on
// the stream writes each group's problem shape, pointers and strides from the
// device offsets into the scratch: no host copy, capturable in a CUDA graph.
// The host checks what it knows (fp8_grouped_gemm.cu); the caller guarantees the tile layouts of
// moe/ops/fp8.h, groups <= kMaxGroups and dims < 2^31.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "moe/ops/cuda/grouped_gemm_cutlass.h"

namespace moe::cuda::cutlass_grouped {

// E4M3 codes and their F32 scales (device pointers).
struct Fp8Operand {
  const void* codes;
  const float* scales;
};

// c[o_e:o_{e+1}] = a[o_e:o_{e+1}] * b[e]^T: a codes [rows, k_in] with Rows scales
// [rows, ceil(k_in / 128)], b codes [E, n_out, k_in] with Blocks scales
// [E, ceil(n_out / 128), ceil(k_in / 128)], c [rows, n_out] BF16 (written, never read). Offsets
// are clamped into [0, rows] on the device; rows outside [o_0, o_E) are not touched.
void fp8_matmul_nt_bf16(void* c, Fp8Operand a, Fp8Operand b, const int32_t* offsets, int groups, int64_t rows,
                        int n_out, int k_in, const Scratch& scratch, cudaStream_t stream);

// db[e] [n_out, k_in] (+= when accumulate, else =) dc_e^T x_e from the columns operands:
// dc_t codes [n_out, columns] and x_t codes [k_in, columns], Columns scales [ceil(columns / 128), .],
// expert e's rows in columns [p_e, p_e + round_up(M_e, 128)) with p_e the sum of round_up(M_g, 128)
// over g < e (computed on the device from offsets). db F32. An expert without rows, or whose
// columns would pass `columns` (offsets that do not match the quantization), is skipped: db[e]
// bit-identical when accumulating, zeros otherwise.
void fp8_wgrad_f32(float* db, Fp8Operand dc_t, Fp8Operand x_t, const int32_t* offsets, int groups, int64_t columns,
                   int n_out, int k_in, bool accumulate, const Scratch& scratch, cudaStream_t stream);

// Raise each kernel's dynamic shared-memory limit (host-only, once per process, outside capture).
void prepare_fp8_nt_bf16();
void prepare_fp8_wgrad_f32();

}  // namespace moe::cuda::cutlass_grouped

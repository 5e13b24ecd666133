// A Hopper FP8 grouped kernel of our own for the expert products c = a * b[e]^T -> BF16 (the
// forward and the data gradient), with the interface and scale layouts of
// cutlass_grouped::fp8_matmul_nt_bf16 (fp8_grouped_gemm_cutlass.h), so the two are interchangeable.
// It differs from CUTLASS's blockwise mainloop where DeepGEMM's kernel did (bench/RESULTS.md,
// thirty-ninth session): a stage is released as soon as its tensor-core products complete, the
// scales come into shared memory with the stage, and whole output tiles leave by TMA store while
// the next tile's loads are already in flight. Built only with the CUTLASS headers (CuTe's SM90
// primitives); needs sm_90a.
//
// Status (bench/RESULTS.md, forty-second and forty-third sessions, one H100): correct in both launch
// forms (test_cuda_fp8_grouped, test_gpu_fp8), and not the default: fp8_grouped_gemm.cu runs it only
// under MOE_FP8_NT_KERNEL=sm90. With one CTA per tile it is 6.5% faster than CUTLASS's kernel at
// K = 1024 and 6.5-13% slower at K = 2048. MOE_SM90_CLUSTER=2 pairs CTAs that multicast A, as
// CUTLASS's 1 x 2 clusters do: 3.7% faster at K = 1024, 2.6-5.6% slower at K = 2048, the
// bench-olmoe-4l step 1.1% slower than with CUTLASS's kernel. MOE_SM90_STAGES=6 deepens the pipeline
// from 5 to 6 stages by storing the output tile one 64-column box at a time from a 16 KB buffer
// (a sixth stage took 2.7% off CUTLASS's expert products, thirtieth session); written in the
// forty-third session, not yet run on a GPU (Sm90KernelMatchesCpu checks it in both launch forms).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "moe/ops/cuda/fp8_grouped_gemm_cutlass.h"

namespace moe::cuda::sm90_fp8 {

// As cutlass_grouped::fp8_matmul_nt_bf16, without a scratch: offsets [groups + 1] on the device
// (clamped into [0, rows]), a codes [rows, k_in] with Rows scales [rows, ceil(k_in / 128)], b codes
// [groups, n_out, k_in] with Blocks scales [groups, ceil(n_out / 128), ceil(k_in / 128)], c [rows,
// n_out] BF16, rows outside [o_0, o_E) untouched. The caller checks the TMA conditions (16-byte
// aligned pointers, k_in % 16 == 0, n_out % 8 == 0) and groups * n_out < 2^31.
void fp8_matmul_nt_bf16(void* c, cutlass_grouped::Fp8Operand a, cutlass_grouped::Fp8Operand b, const int32_t* offsets,
                        int groups, int64_t rows, int n_out, int k_in, cudaStream_t stream);

// Raise the kernel's dynamic shared-memory limit and count the 2-CTA clusters that fit (host-only,
// once per process, outside capture). Never throws: it runs on every FP8 start beside the CUTLASS
// kernels' preparation, and a failure is reported only when this kernel is asked to run.
void prepare_fp8_nt_bf16();

// The developer switches that pick this kernel and its forms (MOE_FP8_NT_KERNEL, MOE_SM90_CLUSTER,
// MOE_SM90_STAGES), read at every call so one process can time each form: false when `name` is
// unset, empty or `default_value`, true when it is `other_value`; any other value is an error naming
// the variable and both accepted values (a mistyped switch would time the wrong kernel).
bool env_switch(const char* name, const char* default_value, const char* other_value);

}  // namespace moe::cuda::sm90_fp8

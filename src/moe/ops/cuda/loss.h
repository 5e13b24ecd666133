// CUDA LM head fused with cross-entropy, chunked over rows exactly like the CPU op (chunk =
// workspace.dim(0)). Semantics: moe/ops/loss.h; ops/loss.cpp checks the arguments.
//
// Dtypes on the GPU: h and weight share T in {F32, BF16}; targets I32; loss_sum [1] F32; workspace
// [chunk, V] F32 (the same shape as on the CPU); dh and dweight are T or F32 (dweight F32 with its
// += is how the gradient accumulates into an FP32 buffer). Products accumulate in FP32 (cuBLASLt,
// CUBLAS_COMPUTE_32F); logits and the softmax are FP32, the exponential sum FP64 as on the CPU.
//
// Per chunk of n rows: logits [n, V] = h_chunk W^T into the F32 workspace (cuBLASLt); one kernel
// turns each row into its loss and, in place, into G = grad_scale * (softmax - onehot) (0 for
// ignored rows); then dh_chunk = G W and dweight += G^T h_chunk (cuBLASLt).
//
// NOTES: cuBLASLt multiplies only operands of one type, so for T = BF16 the kernel writes G as
// BF16 into the first half of each F32 row it has just read (row i of G starts where F32 row i
// starts: a BF16 matrix [n, V] with leading dim 2V). The kernel reads each row strip by strip,
// with a barrier between the reads and the writes of a strip; the BF16 values of strip s land
// on F32 elements below the end of strip s, already read, so no value is overwritten before it
// is used and the workspace stays [chunk, V] F32. G is rounded to BF16 there (as a BF16 autograd
// would); for T = F32 it stays F32 in place, as on the CPU.
// NOTES: where a row of F32 logits fits in shared memory (V * 4 bytes within the GPU's opt-in
// limit: V up to ~58K on Hopper), the kernel stages the row there instead: one global read per
// row and no strip barriers (the per-strip barriers of the form above kept the kernel at ~30% of
// HBM bandwidth at V = 50304). The results differ only in the summation order of the FP64
// exponential sum.
// NOTES: the loss is deterministic without atomics: a fixed 256-block grid (independent of the
// GPU) gives each block the rows i = b mod 256 in order, each block writes one FP64 partial into
// the stream's scratch (moe/ops/cuda/gemm.h), and one thread adds the partials in block order to
// a running FP64 total, written to loss_sum (rounded to F32) after the last chunk.
// Targets must lie in [-1, V); the host cannot check them (they live on the device): a row whose
// target is outside gets a NaN loss (so the step's loss shows it) and a zero gradient.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe::cuda {

void lm_head_cross_entropy(Tensor loss_sum, Tensor dh, Tensor dweight, Tensor h, Tensor weight, Tensor targets,
                           float grad_scale, Tensor workspace, Stream stream);

}  // namespace moe::cuda

// CUDA embedding lookup/accumulation and element-wise helpers. Semantics: moe/ops/embedding.h
// (same signatures).
//
// Dtypes: embedding_forward: table and out share T, F32 or BF16 (__nv_bfloat16); tokens I32.
// embedding_backward: dout is T (F32 or BF16), dtable is F32 and accumulated (+=); tokens I32.
// add_inplace: y and x share T, F32 or BF16, summed in FP32. fill_zero and copy: any dtype.
// cast_copy: F32 <-> BF16 (round to nearest even, bit-identical to moe::f32_to_bf16), or a plain
// copy when the dtypes match.
// accumulate_scalars: stats F32, each src F32 or I32.
// All tensors live on the CUDA device; ops run on `stream`, allocate nothing, never synchronize.
// NOTES: token ids are not checked against V on the host (that would need a device-to-host copy;
// the data loader validates them). In the kernels an id outside [0, V) never touches memory out
// of range: embedding_forward writes NaN to that row, embedding_backward skips it.
// embedding_backward is deterministic and bit-identical to the CPU op (same per-element order of
// FP32 additions).
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/embedding.h"

namespace moe::cuda {

void embedding_forward(Tensor out, Tensor table, Tensor tokens, Stream stream = {});
void embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Stream stream = {});
void add_inplace(Tensor y, Tensor x, Stream stream = {});
void fill_zero(Tensor y, Stream stream = {});
void copy(Tensor dst, Tensor src, Stream stream = {});
void cast_copy(Tensor dst, Tensor src, Stream stream = {});
// NOTES: the terms travel by value in the kernel's parameters (up to 64 per launch; more take
// several launches on the stream, in order), so a call allocates nothing, copies nothing from the
// host and can be captured in a CUDA graph. Ranges of slot and index are checked on the host.
void accumulate_scalars(Tensor stats, const std::vector<ScalarTerm>& terms, Stream stream = {});

}  // namespace moe::cuda

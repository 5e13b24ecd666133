// CUDA embedding lookup and accumulation. Semantics: moe/ops/embedding.h (same signatures);
// ops/embedding.cpp checks the arguments.
//
// Dtypes: embedding_forward: table and out share T, F32 or BF16 (__nv_bfloat16); tokens I32.
// embedding_backward: dout is T (F32 or BF16), dtable is F32 and accumulated (+=); tokens I32.
// All tensors live on the CUDA device; ops run on `stream`, allocate nothing, never synchronize.
// NOTES: token ids are not checked against V on the host (that would need a device-to-host copy;
// the data loader validates them). In the kernels an id outside [0, V) never touches memory out
// of range: embedding_forward writes NaN to that row, embedding_backward skips it.
// embedding_backward is deterministic and bit-identical to the CPU op (same per-element order of
// FP32 additions).
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe::cuda {

void embedding_forward(Tensor out, Tensor table, Tensor tokens, Stream stream = {});
void embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Stream stream = {});

}  // namespace moe::cuda

// CPU embedding lookup and element-wise helpers. Semantics: moe/ops/embedding.h.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/embedding.h"

namespace moe::cpu {

void embedding_forward(Tensor out, Tensor table, Tensor tokens, Stream stream);
void embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Stream stream);
void add_inplace(Tensor y, Tensor x, Stream stream);
void fill_zero(Tensor y, Stream stream);
void copy(Tensor dst, Tensor src, Stream stream);
void cast_copy(Tensor dst, Tensor src, Stream stream);
void accumulate_scalars(Tensor stats, const std::vector<ScalarTerm>& terms, Stream stream);

}  // namespace moe::cpu

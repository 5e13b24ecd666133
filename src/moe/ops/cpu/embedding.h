// CPU embedding lookup and its gradient (F32). Semantics: moe/ops/embedding.h; ops/embedding.cpp
// checks the arguments, token ids included.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe::cpu {

void embedding_forward(Tensor out, Tensor table, Tensor tokens, Stream stream);
void embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Stream stream);

}  // namespace moe::cpu

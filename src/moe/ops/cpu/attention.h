// CPU causal attention (blocked, online softmax). Semantics: moe/ops/attention.h.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/attention.h"

namespace moe::cpu {

// Sized for omp_get_max_threads() threads at the time of the call.
int64_t attention_workspace_elems(const AttentionShape& s);

void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttentionShape& s,
                       Tensor workspace, Stream stream);
void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                        Tensor lse, const AttentionShape& s, Tensor workspace, Stream stream);

}  // namespace moe::cpu

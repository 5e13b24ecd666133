// Causal scaled dot-product attention with grouped-query heads, memory-efficient: the CPU
// version processes blocks of queries with an online softmax and never holds a T x T matrix;
// backward recomputes probabilities from the saved log-sum-exp.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

struct AttentionShape {
  int64_t batch = 0;
  int64_t seq_len = 0;
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // key/value heads; query head h reads kv head h / (n_heads / n_kv_heads)
  int64_t head_dim = 0;
  // Backward with a fixed summation order, the same bits on every call. The CPU op always sums in
  // a fixed order; on the GPU this selects cuDNN's deterministic algorithm, which keeps the score
  // gradients in a workspace (attention_deterministic_workspace_bytes) instead of accumulating dQ
  // with atomics.
  bool deterministic = false;
};

// The workspace cuDNN's deterministic backward needs for shape s: the B x Hq x T x T BF16 score
// gradients, T rounded up to 64 (the cuDNN frontend's dP workspace; it replaces the default
// algorithm's B x Hq x T x hd FP32 dQ accumulator, 32x smaller at T = 4096, hd = 128).
int64_t attention_deterministic_workspace_bytes(const AttentionShape& s);

// Workspace (FP32 elements) that attention_forward/backward need for a given shape.
int64_t attention_workspace_elems(const AttentionShape& s);

// q [B*T, Hq*hd], k, v [B*T, Hkv*hd] (token-major, as the projections write them);
// out [B*T, Hq*hd]; lse [B, Hq, T] log-sum-exp of the scaled scores, saved for backward.
// Scale 1/sqrt(hd); query t attends to keys 0..t of its own sequence.
void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttentionShape& s,
                       Tensor workspace, Stream stream = {});

// Writes dq, dk, dv (overwritten, not accumulated) from dout and the forward's q, k, v, out, lse.
void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                        Tensor lse, const AttentionShape& s, Tensor workspace, Stream stream = {});

}  // namespace moe

// Selective activation recompute (`train.recompute`): which activations a layer keeps from its
// forward to its backward, and which it drops and computes again in backward. A dropped activation
// is not reserved per layer: every layer writes it into one shared buffer, which backward
// rewrites (from what the layer kept) right before it reads it. Recompute never changes results:
// the recomputed values are the forward's, by the same ops on the same inputs.
//
//   none:      every layer keeps everything its backward reads.
//   experts:   MoE layers drop the routed experts' gate/up products and SwiGLU outputs (and the
//              shared expert's), recomputed from the kept expert input (and the FFN norm output):
//              one more gate/up grouped GEMM, and the SwiGLU output written by the SwiGLU backward
//              in the same pass (no second SwiGLU).
//   attention: every layer drops the attention block's internals (input-norm output and rstd, the
//              q/k/v projections before and after qk-norm and RoPE, the qk-norm rstds, the
//              attention output and its softmax statistics), recomputed from the layer input.
//   block:     every layer keeps only its input (and, for MoE layers, the routing decision: top-K
//              ids and weights, expert counts, route index, expert offsets, and its two auxiliary
//              losses) and recomputes the whole block in backward. The MoE block then replays the
//              saved routing: the router runs again only for the scores its backward needs, the
//              rows are dispatched again with the saved route index into the dispatcher's shared
//              recompute buffers (no lease), and every rank re-dispatches the same layers in the
//              same order, so under EP > 1 the collective calls line up.
//
// experts and attention: a layer whose backward runs right after its own forward (the top layer
// of a microbatch without pipeline, the top layer of the last stage's chunk under 1F1B) finds its
// dropped activations still in the shared buffers, which no other pass has written since, and
// does not compute them again. Nothing else changes: the buffers hold the forward's bits either
// way, and the memory is the same. The model tracks which layer and activation set last wrote the
// shared buffers (Transformer::scratch_holds_), so any schedule gets it only where it holds. Not
// in block mode, whose recompute also dispatches again (a collective every rank must make).
#pragma once

namespace moe {

enum class Recompute { None, Experts, Attention, Block };

inline const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Experts: return "experts";
    case Recompute::Attention: return "attention";
    case Recompute::Block: return "block";
  }
  return "?";
}

}  // namespace moe

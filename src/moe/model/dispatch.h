// The token-dispatch interface of the MoE block (DESIGN.md section 6, steps 2-7). The block
// routes; a dispatcher decides where each (token, k) route's row goes, moves rows to the
// experts held on this rank and brings the results back. Backends: local (EP = 1, in
// parallel/), rowwise and alltoall (expert parallelism, arriving with multi-rank training).
// The model never knows which backend runs or how many ranks exist.
#pragma once

#include <cstdint>

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

// Routing placement of one MoE layer for one microbatch, saved for backward.
struct RoutePlan {
  Tensor route_index;     // [T*K] i32: row of route (t, k) in the (possibly remote) expert buffer, -1 = dropped
  Tensor expert_offsets;  // [E_local + 1] i32: rows of local expert e are [offsets[e], offsets[e+1])
};

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  virtual const char* name() const = 0;
  // Rows of the expert buffer on this rank for microbatches of `tokens` tokens (fixed at start-up).
  virtual int64_t expert_rows(int64_t tokens, int64_t top_k) const = 0;
  // Experts held on this rank: [first_expert(), first_expert() + local_experts()).
  virtual int64_t first_expert() const = 0;
  virtual int64_t local_experts() const = 0;

  // Counts agreement, capacity and tail drop, route index (steps 2-4). expert_counts [N] i32 are
  // this rank's routes per expert.
  virtual void plan(const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts, Stream stream) = 0;
  // expert_in[rows] <- x[token] for every kept route (step 5).
  virtual void dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) = 0;
  // out[t] += sum_k weights[t,k] * expert_out[route (t,k)] (step 7).
  virtual void combine(Tensor out, Tensor expert_out, Tensor weights, const RoutePlan& plan, int top_k,
                       Stream stream) = 0;
  // Gradients of combine: d_expert_out rows and dweights [T, K].
  virtual void combine_backward(Tensor d_expert_out, Tensor dweights, Tensor dout, Tensor expert_out, Tensor weights,
                                const RoutePlan& plan, int top_k, Stream stream) = 0;
  // Gradient of dispatch: dx[t] = sum over kept k of d_expert_in[route (t,k)] (overwrites dx).
  virtual void dispatch_backward(Tensor dx, Tensor d_expert_in, const RoutePlan& plan, int top_k,
                                 Stream stream) = 0;
};

}  // namespace moe

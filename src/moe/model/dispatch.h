// The token-dispatch interface of the MoE block. The block
// routes; a dispatcher decides where each (token, k) route's row goes, moves rows to the
// experts held on this rank and brings the results back. Backends: local (EP = 1), rowwise
// (stores rows straight into peers' symmetric buffers) and alltoall (variable all-to-all with
// host-side counts, the baseline). The model never knows which backend runs or how many ranks
// exist.
//
// Leases: a layer's expert buffers written in forward are read again in backward (the expert
// input for the weight gradient, the expert output for the combine-weight gradient). Each MoE
// layer owns a pool of `slots_per_layer` buffer pairs fixed at start-up; forward acquires a
// lease, backward releases it after its last read. A lease that cannot be granted is an error
// naming the pool and the setting to raise, never a silent allocation. The backends share this
// bookkeeping and the capacity rule (parallel/expert_buffers.h).
//
// Recompute (train.recompute = block, model/recompute.h): MoE layers keep no expert buffers from
// forward to backward. The dispatcher then reserves no lease pools but one pair shared by every
// layer (recompute_buffers()); a layer dispatches into it in forward and dispatches again, with
// the route plan it saved, in backward, where it recomputes the expert outputs before
// combine_backward reads them.
//
// Payload (ep.payload): what dispatch moves into expert_in. bf16: the token rows in the activation
// dtype (BF16 on the GPU, F32 on the CPU). fp8 (with train.precision = "fp8" only): each token row
// is quantized once at its source into 1 x 128 E4M3 tiles with power-of-two scales (the bits
// fp8_quantize_rows writes) and its codes and scales move, about half the bytes of BF16. The expert
// GEMM would quantize its input rows into exactly these tiles, so the forward products are those of
// bf16 bit for bit. Combine and every backward gradient stay in the activation dtype.
#pragma once

#include <cstddef>
#include <cstdint>

#include "moe/core/arena.h"
#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"

namespace moe {

enum class Payload { BF16, FP8 };

inline const char* to_string(Payload p) { return p == Payload::FP8 ? "fp8" : "bf16"; }

// Routing placement of one MoE layer for one microbatch, saved for backward.
struct RoutePlan {
  Tensor route_index;     // [T*K] i32: dst_rank * expert_rows + dst_row of route (t, k), or -1 = dropped
  Tensor expert_offsets;  // [E_local + 1] i32: rows of local expert e are [offsets[e], offsets[e+1])
};

// Expert-side rows of one layer: dispatched inputs and expert outputs, [expert_rows, D] each. With
// payload fp8 expert_in holds E4M3 codes and expert_in_scales their F32 scales [expert_rows,
// ceil(D / 128)]; otherwise (and in grad_buffers()) expert_in_scales is empty.
struct ExpertBuffers {
  Tensor expert_in;
  Tensor expert_out;
  Tensor expert_in_scales;

  bool fp8_input() const { return !expert_in_scales.empty(); }
  // expert_in as an FP8 operand (payload fp8 only).
  Fp8Tensor fp8_expert_in() const { return Fp8Tensor{expert_in, expert_in_scales, Fp8Tiles::Rows}; }
};

struct Lease {
  int layer = -1;
  int slot = -1;
  ExpertBuffers buffers;
};

// What the dispatcher must hold, known at start-up.
struct DispatchShape {
  int64_t tokens = 0;    // tokens per microbatch on this rank
  int64_t top_k = 0;
  int64_t hidden = 0;    // d_model
  int num_layers = 0;    // layer ids run from 0 to num_layers - 1
  int slots_per_layer = 1;  // lease slots per layer: microbatches whose forward ran and backward has not, at once
  int first_layer = 0;   // pools (and their buffers) exist for MoE layers first_layer..num_layers-1 only
  DType dtype = DType::F32;  // of the activation rows moved (BF16 on the GPU)
  // Every MoE layer recomputes its expert rows in backward: no lease pools, one recompute_buffers() pair instead.
  bool recompute = false;
  // FP8: expert_in buffers (leases and the recompute pair) hold codes and scales, filled by dispatch_fp8.
  Payload payload = Payload::BF16;
  // false: grad_buffers() has no expert_out (empty), for a model that never stores d(expert output)
  // (it quantizes it from the token rows where routes_stay_local()); combine_backward is then not called.
  bool grad_expert_out = true;
};

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  virtual const char* name() const = 0;
  // Every route's row is on this rank (EP = 1): route_index entries are rows of this rank's expert
  // buffers, which the model may then read with local ops (moe/ops/permute.h, moe/ops/fp8_gather.h)
  // in place of combine_backward. True only for backends that also run dispatch_fp8.
  virtual bool routes_stay_local() const { return false; }
  // Rows of the expert buffer on this rank for microbatches of `tokens` tokens (fixed at start-up).
  virtual int64_t expert_rows(int64_t tokens, int64_t top_k) const = 0;
  // Experts held on this rank: [first_expert(), first_expert() + local_experts()).
  virtual int64_t first_expert() const = 0;
  virtual int64_t local_experts() const = 0;

  // Start-up, before `arena` is committed (collective for multi-rank backends): reserves the lease
  // pools (or, with shape.recompute, the recompute pair) and the backward scratch.
  virtual void reserve_buffers(const DispatchShape& shape, Arena& arena) = 0;
  // Bytes this rank holds outside `arena` for its buffers (a symmetric heap), for memory reports.
  virtual size_t heap_bytes() const { return 0; }
  virtual Lease acquire(int layer) = 0;
  virtual void release(const Lease& lease) = 0;
  // Backward scratch shared by all layers: expert_out holds d(expert output) (combine-backward
  // target; empty when reserved without grad_expert_out), expert_in holds d(expert input)
  // (dispatch-backward source).
  virtual ExpertBuffers grad_buffers() = 0;
  // The (expert_in, expert_out) pair every MoE layer uses instead of a lease when the shape was
  // reserved with `recompute`: written in forward, and written again in backward by the
  // re-dispatch and the recomputed experts. Throws when reserved without `recompute`.
  virtual ExpertBuffers recompute_buffers() = 0;

  // Counts agreement, capacity and tail drop, route index (steps 2-4) of MoE layer `layer` (named
  // in errors). expert_counts [N] i32 are this rank's routes per expert: the histogram of topk_idx.
  virtual void place_routes(int layer, const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts,
                            Stream stream) = 0;
  // expert_in[rows] <- x[token] for every kept route (step 5).
  virtual void dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) = 0;
  // Payload fp8, and FP8 with every route on this rank: dispatch with each token row of x quantized
  // once at the source (1 x 128 tiles,
  // fp8_quantize_rows' bits); its codes and scales land in expert_in's rows (a lease's or the
  // recompute pair's fp8_expert_in()). A backend that does not move FP8 rows (alltoall) refuses the
  // payload in reserve_buffers already.
  virtual void dispatch_fp8(Fp8Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) = 0;
  // out[t] += sum_k weights[t,k] * expert_out[route (t,k)] (step 7).
  virtual void combine(Tensor out, Tensor expert_out, Tensor weights, const RoutePlan& plan, int top_k,
                       Stream stream) = 0;
  // Gradients of combine: d_expert_out rows and dweights [T, K]. When expert_out is the recompute
  // pair's, its rows were rewritten in this backward (the recomputed experts): a backend that reads
  // peers' buffers first waits until every owner has written them.
  virtual void combine_backward(Tensor d_expert_out, Tensor dweights, Tensor dout, Tensor expert_out, Tensor weights,
                                const RoutePlan& plan, int top_k, Stream stream) = 0;
  // Gradient of dispatch: dx[t] = sum over kept k of d_expert_in[route (t,k)] (overwrites dx).
  virtual void dispatch_backward(Tensor dx, Tensor d_expert_in, const RoutePlan& plan, int top_k,
                                 Stream stream) = 0;

  // Payload bytes moved by dispatch and combine since construction (every kept route's row once
  // each way: with payload fp8 its codes and scales one way, its activation-dtype row the other;
  // backward traffic not counted), and the part that crossed to another rank. Counted
  // when place_routes() places the rows, so a dispatch repeated in backward (recompute) is not
  // counted again. 0 for
  // local, which moves nothing between ranks. A GPU backend counts on the device and reports the
  // totals as of its last check_after_step().
  virtual int64_t bytes_moved() const { return 0; }
  virtual int64_t remote_bytes_moved() const { return 0; }
  // Once after every step, when the device is idle (the trainer calls it right after reading the
  // step's statistics): a backend that checks or counts on the device during the step (the GPU
  // rowwise one: expert_counts against topk_idx, bytes moved) reads the result here and throws
  // naming the layer if a check failed. CPU backends check as they go; for them it does nothing.
  virtual void check_after_step() {}
};

}  // namespace moe

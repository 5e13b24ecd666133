// Optimizer ops over flat FP32 buffers (the AdamW moments FP32 or BF16): gradient norm and AdamW.
// Clipping and the non-finite skip are decided inside the update from the squared norm in memory,
// so the GPU path needs no host round trip.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// F32 elements of the workspace sum_squares_accumulate needs on `device` for an x of n elements
// (the GPU's per-block partial sums; 0 on the CPU). Reserved by the caller when it plans memory.
int64_t sum_squares_workspace_elems(Device device, int64_t n);

// out[0] += sum_i x[i]^2 (x FP32, any shape; accumulated in double on the CPU). workspace: F32 with
// at least sum_squares_workspace_elems(x.device, x.numel()) elements on x's device (may be empty
// when that is 0), owned by this call until it completes: calls on different streams run
// concurrently when each has its own workspace.
void sum_squares_accumulate(Tensor out, Tensor x, Tensor workspace, Stream stream = {});

// One AdamW step on param/grad/m/v (same shapes; param and grad FP32, the moments m and v both
// FP32 or both BF16), torch.optim.AdamW semantics:
//   if grad_norm_sq[0] is not finite: nothing changes (the step is skipped);
//   clip = max_norm > 0 ? min(1, max_norm / (sqrt(grad_norm_sq[0]) + 1e-6)) : 1;  g = clip * grad;
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   param = param * (1 - lr * wd) - lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps).
// step counts from 1. Everything is computed in FP32. BF16 moments are read widened (exact) and the
// new m and v are stored rounded to nearest even in the same pass; the param update uses the FP32
// values before that rounding (the moments' storage dtype changes what the next step reads, not
// this step's update).
// schedule: empty, or F32 [2] on the params' device: schedule[0] = lr, schedule[1] = step (counting
// from 1, a whole number). When given, lr and step are read from it in memory when the update runs,
// and cfg.lr and `step` are ignored: a captured CUDA graph replays with a new learning rate and step
// written into schedule before each replay. Same lr and step give the same bits either way (the
// GPU computes its bias corrections on the device, in double as the host does).
// param_bf16: empty, or BF16 with param's element count: the updated param rounded to BF16
// (round-to-nearest-even) is written there in the same pass, so the model's BF16 compute copy
// needs no second pass over the FP32 weights. A skipped step writes nothing (the copy already
// holds the unchanged param).
void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                const AdamWConfig& cfg, int64_t step, Stream stream = {}, Tensor schedule = {},
                Tensor param_bf16 = {});

// What adamw_step decided from grad_norm_sq (F32 [1], either device), read back on the host: waits
// for the device.
struct AdamWOutcome {
  double grad_norm = 0;  // global L2 norm of the gradient, before clipping
  bool skipped = false;  // non-finite norm: nothing was updated
};
AdamWOutcome read_adamw_outcome(const Tensor& grad_norm_sq);

}  // namespace moe

#include "moe/ops/router.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "moe/ops/cpu/router.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/router.h")
#include "moe/ops/cuda/router.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

namespace {

// logits F32 [T, N] with at least one expert; returns {T, N}.
std::pair<int64_t, int64_t> check_logits(const OpCheck& check, const Tensor& logits) {
  check.tensor("logits", logits, DType::F32);
  MOE_CHECK(logits.ndim() == 2, check.op(), ": logits must be [T, N], got ", logits.shape.str());
  MOE_CHECK(logits.dim(1) >= 1, check.op(), ": logits has no experts (N = 0)");
  return {logits.dim(0), logits.dim(1)};
}

// topk_idx I32 [T, K] with 1 <= K <= N; returns K.
int64_t check_topk_idx(const OpCheck& check, const Tensor& topk_idx, int64_t T, int64_t N) {
  check.tensor("topk_idx", topk_idx, DType::I32);
  MOE_CHECK(topk_idx.ndim() == 2 && topk_idx.dim(0) == T, check.op(), ": topk_idx must be [", T, ", K], got ",
            topk_idx.shape.str());
  const int64_t K = topk_idx.dim(1);
  MOE_CHECK(K >= 1 && K <= N, check.op(), ": top_k = ", K, " must be in [1, N = ", N, "]");
  return K;
}

// An F32 tensor of exactly `shape`.
void check_f32(const OpCheck& check, const char* name, const Tensor& t, const Shape& shape) {
  check.tensor(name, t, DType::F32);
  check.shape(name, t, shape);
}

}  // namespace

void router_forward(Tensor scores, Tensor topk_idx, Tensor topk_weight, Tensor logits, Tensor bias, ScoreFn fn,
                    bool normalize, Stream stream) {
  const OpCheck check("router_forward", logits.device);
  const auto [T, N] = check_logits(check, logits);
  const int64_t K = check_topk_idx(check, topk_idx, T, N);
  check_f32(check, "scores", scores, {T, N});
  check_f32(check, "topk_weight", topk_weight, {T, K});
  if (!bias.empty()) check_f32(check, "bias", bias, {N});
  MOE_OP_DISPATCH(logits.device, router_forward, scores, topk_idx, topk_weight, logits, bias, fn, normalize, stream);
}

void synthetic_routing(Tensor topk_idx, Tensor topk_weight, bool random, int64_t num_experts, uint64_t seed,
                       int64_t layer, Stream stream) {
  const OpCheck check("synthetic_routing", topk_idx.device);
  const char* op = check.op();
  check.tensor("topk_idx", topk_idx, DType::I32);
  MOE_CHECK(topk_idx.ndim() == 2, op, ": topk_idx must be [T, K], got ", topk_idx.shape.str());
  const int64_t T = topk_idx.dim(0), K = topk_idx.dim(1), N = num_experts;
  check_f32(check, "topk_weight", topk_weight, {T, K});
  MOE_CHECK(N >= 1 && N <= std::numeric_limits<int32_t>::max(), op, ": num_experts = ", N,
            " must be in [1, 2^31) (expert ids are I32)");
  MOE_CHECK(K >= 1 && K <= N, op, ": top_k = ", K, " must be in [1, num_experts = ", N,
            "]: each token takes K distinct experts");
  MOE_CHECK(layer >= 0, op, ": layer = ", layer, " is negative");
  MOE_OP_DISPATCH(topk_idx.device, synthetic_routing, topk_idx, topk_weight, random, num_experts, seed, layer, stream);
}

int64_t router_losses_workspace_elems(Device device, int64_t tokens, int64_t experts) {
  MOE_CHECK(tokens >= 0 && experts >= 0, "router_losses_workspace_elems: tokens = ", tokens, " and experts = ", experts,
            " must be non-negative");
  MOE_OP_DISPATCH(device, router_losses_workspace_elems, tokens, experts);
}

void router_losses(Tensor lb_loss, Tensor z_loss, Tensor expert_counts, Tensor scores, Tensor logits, int top_k,
                   Tensor workspace, Stream stream) {
  const OpCheck check("router_losses", logits.device);
  const char* op = check.op();
  const auto [T, N] = check_logits(check, logits);
  MOE_CHECK(T >= 1, op, ": logits ", logits.shape.str(), " must have at least one token");
  MOE_CHECK(top_k >= 1 && top_k <= N, op, ": top_k = ", top_k, " must be in [1, N = ", N, "]");
  check_f32(check, "scores", scores, {T, N});
  check.tensor("expert_counts", expert_counts, DType::I32);
  check.shape("expert_counts", expert_counts, {N});
  check.tensor("lb_loss", lb_loss, DType::F32);
  check.numel("lb_loss", lb_loss, 1);
  check.tensor("z_loss", z_loss, DType::F32);
  check.numel("z_loss", z_loss, 1);
  check.workspace("workspace", workspace, router_losses_workspace_elems(logits.device, T, N),
                  "router_losses_workspace_elems");
  MOE_OP_DISPATCH(logits.device, router_losses, lb_loss, z_loss, expert_counts, scores, logits, top_k, workspace,
                  stream);
}

void router_backward(Tensor dlogits, Tensor dtopk_weight, Tensor topk_idx, Tensor topk_weight, Tensor scores,
                     Tensor logits, Tensor expert_counts, float lb_scale, float z_scale, ScoreFn fn, bool normalize,
                     Stream stream) {
  const OpCheck check("router_backward", dlogits.device);
  const auto [T, N] = check_logits(check, logits);
  const int64_t K = check_topk_idx(check, topk_idx, T, N);
  check_f32(check, "dlogits", dlogits, {T, N});
  check_f32(check, "scores", scores, {T, N});
  check_f32(check, "dtopk_weight", dtopk_weight, {T, K});
  check_f32(check, "topk_weight", topk_weight, {T, K});
  check.tensor("expert_counts", expert_counts, DType::I32);
  check.shape("expert_counts", expert_counts, {N});
  // The GPU skips ids outside [0, N) instead (see ops/cuda/router.h).
  if (check.host_data()) check.values_in("topk_idx", topk_idx, 0, N, "an expert id");
  MOE_OP_DISPATCH(dlogits.device, router_backward, dlogits, dtopk_weight, topk_idx, topk_weight, scores, logits,
                  expert_counts, lb_scale, z_scale, fn, normalize, stream);
}

}  // namespace moe

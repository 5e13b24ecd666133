#include "moe/ops/route.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "moe/ops/cpu/route.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/route.h")
#include "moe/ops/cuda/route.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

namespace {

// expert_counts I32 [N] and topk_idx I32 [T, K] whose routes fit I32 row indices (and, where the
// host can read them, name experts in [0, N)); returns N.
int64_t check_counts_and_topk(const OpCheck& check, const Tensor& expert_counts, const Tensor& topk_idx) {
  const char* op = check.op();
  check.tensor("expert_counts", expert_counts, DType::I32);
  MOE_CHECK(expert_counts.ndim() == 1, op, ": expert_counts must be [N], got ", expert_counts.shape.str());
  check.tensor("topk_idx", topk_idx, DType::I32);
  MOE_CHECK(topk_idx.ndim() == 2, op, ": topk_idx must be [T, K], got ", topk_idx.shape.str());
  MOE_CHECK(topk_idx.numel() <= std::numeric_limits<int32_t>::max(), op, ": ", topk_idx.numel(),
            " routes do not fit I32 row indices");
  const int64_t N = expert_counts.dim(0);
  // The GPU ignores ids outside [0, N) instead (see ops/cuda/route.h).
  if (check.host_data()) check.values_in("topk_idx", topk_idx, 0, N, "an expert id");
  return N;
}

}  // namespace

void route_counts(Tensor expert_counts, Tensor topk_idx, Stream stream) {
  check_counts_and_topk(OpCheck("route_counts", topk_idx.device), expert_counts, topk_idx);
  MOE_OP_DISPATCH(topk_idx.device, route_counts, expert_counts, topk_idx, stream);
}

void route_index_local(Tensor route_index, Tensor expert_offsets, Tensor topk_idx, Tensor expert_counts,
                       int64_t rank_capacity, Stream stream) {
  const OpCheck check("route_index_local", topk_idx.device);
  const char* op = check.op();
  const int64_t N = check_counts_and_topk(check, expert_counts, topk_idx);
  const int64_t routes = topk_idx.numel();
  check.tensor("route_index", route_index, DType::I32);
  check.numel("route_index", route_index, routes, "T*K");
  check.tensor("expert_offsets", expert_offsets, DType::I32);
  MOE_CHECK(expert_offsets.ndim() == 1 && expert_offsets.dim(0) == N + 1, op, ": expert_offsets has shape ",
            expert_offsets.shape.str(), ", expected [", N + 1, "]");
  MOE_CHECK(rank_capacity >= 0, op, ": rank_capacity = ", rank_capacity, " is negative");
  // The counts must be those of this topk_idx, or rows of one expert would spill into the next. The
  // GPU trusts them (see ops/cuda/route.h).
  if (check.host_data()) {
    std::vector<int64_t> actual(static_cast<size_t>(N), 0);
    const int32_t* idx = topk_idx.i32();
    const int32_t* counts = expert_counts.i32();
    for (int64_t i = 0; i < routes; ++i) ++actual[static_cast<size_t>(idx[i])];
    for (int64_t e = 0; e < N; ++e)
      MOE_CHECK(counts[e] == actual[static_cast<size_t>(e)], op, ": expert_counts[", e, "] = ", counts[e],
                " but topk_idx routes ", actual[static_cast<size_t>(e)], " tokens to expert ", e,
                "; pass the route_counts of this topk_idx");
  }
  MOE_OP_DISPATCH(topk_idx.device, route_index_local, route_index, expert_offsets, topk_idx, expert_counts,
                  rank_capacity, stream);
}

void accumulate_counts(Tensor load, Tensor counts, Stream stream) {
  const OpCheck check("accumulate_counts", load.device);
  check.tensor("load", load, DType::F32);
  MOE_CHECK(load.ndim() == 1, check.op(), ": load must be [N], got ", load.shape.str());
  check.tensor("counts", counts, DType::I32);
  MOE_CHECK(counts.shape == load.shape, check.op(), ": counts has shape ", counts.shape.str(), ", expected ",
            load.shape.str(), " (one count per expert of load)");
  MOE_OP_DISPATCH(load.device, accumulate_counts, load, counts, stream);
}

}  // namespace moe

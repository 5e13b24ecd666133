// CPU routing metadata. The work is O(T*K) integer bookkeeping done serially, which also makes
// the order of rows within an expert (token, then k) fall out of the loop order directly.
#include "moe/ops/cpu/route.h"

#include <cstdint>
#include <limits>
#include <vector>

namespace moe::cpu {

namespace {

void check_i32(const Tensor& t, const char* op, const char* name) {
  MOE_CHECK(t.data != nullptr || t.numel() == 0, op, ": ", name, " has no data");
  MOE_CHECK(t.device == Device::CPU, op, ": ", name, " is on ", device_name(t.device), ", expected cpu");
  MOE_CHECK(t.dtype == DType::I32, op, ": ", name, " has dtype ", dtype_name(t.dtype), ", expected I32");
}

void check_f32(const Tensor& t, const char* op, const char* name) {
  MOE_CHECK(t.data != nullptr || t.numel() == 0, op, ": ", name, " has no data");
  MOE_CHECK(t.device == Device::CPU, op, ": ", name, " is on ", device_name(t.device), ", expected cpu");
  MOE_CHECK(t.dtype == DType::F32, op, ": ", name, " has dtype ", dtype_name(t.dtype), ", expected F32");
}

// topk_idx must be [T, K] with every entry in [0, N).
void check_topk_idx(const Tensor& topk_idx, int64_t N, const char* op) {
  check_i32(topk_idx, op, "topk_idx");
  MOE_CHECK(topk_idx.ndim() == 2, op, ": topk_idx must be [T, K], got ", topk_idx.shape.str());
  const int64_t K = topk_idx.dim(1);
  const int32_t* idx = topk_idx.i32();
  for (int64_t i = 0; i < topk_idx.numel(); ++i)
    MOE_CHECK(idx[i] >= 0 && idx[i] < N, op, ": topk_idx[", i / K, ", ", i % K, "] = ", idx[i],
              " is not an expert in [0, ", N, ")");
}

}  // namespace

void route_counts(Tensor expert_counts, Tensor topk_idx, Stream /*stream*/) {
  constexpr const char* op = "route_counts";
  check_i32(expert_counts, op, "expert_counts");
  MOE_CHECK(expert_counts.ndim() == 1, op, ": expert_counts must be [N], got ", expert_counts.shape.str());
  const int64_t N = expert_counts.dim(0);
  check_topk_idx(topk_idx, N, op);
  int32_t* counts = expert_counts.i32();
  const int32_t* idx = topk_idx.i32();
  for (int64_t e = 0; e < N; ++e) counts[e] = 0;
  for (int64_t i = 0; i < topk_idx.numel(); ++i) ++counts[idx[i]];
}

void route_index_local(Tensor route_index, Tensor expert_offsets, Tensor topk_idx, Tensor expert_counts,
                       int64_t rank_capacity, Stream /*stream*/) {
  constexpr const char* op = "route_index_local";
  check_i32(expert_counts, op, "expert_counts");
  MOE_CHECK(expert_counts.ndim() == 1, op, ": expert_counts must be [N], got ", expert_counts.shape.str());
  const int64_t N = expert_counts.dim(0);
  check_topk_idx(topk_idx, N, op);
  const int64_t routes = topk_idx.numel();
  check_i32(route_index, op, "route_index");
  MOE_CHECK(route_index.numel() == routes, op, ": route_index has shape ", route_index.shape.str(), ", expected [",
            routes, "] (T*K)");
  check_i32(expert_offsets, op, "expert_offsets");
  MOE_CHECK(expert_offsets.ndim() == 1 && expert_offsets.dim(0) == N + 1, op, ": expert_offsets has shape ",
            expert_offsets.shape.str(), ", expected [", N + 1, "]");
  MOE_CHECK(rank_capacity >= 0, op, ": rank_capacity = ", rank_capacity, " is negative");
  MOE_CHECK(routes <= std::numeric_limits<int32_t>::max(), op, ": ", routes, " routes do not fit I32 row indices");

  const int32_t* counts = expert_counts.i32();
  const int32_t* idx = topk_idx.i32();
  int32_t* offsets = expert_offsets.i32();
  int32_t* index = route_index.i32();

  // The counts must be those of this topk_idx, or rows of one expert would spill into the next.
  std::vector<int64_t> actual(static_cast<size_t>(N), 0);
  for (int64_t i = 0; i < routes; ++i) ++actual[idx[i]];
  for (int64_t e = 0; e < N; ++e)
    MOE_CHECK(counts[e] == actual[e], op, ": expert_counts[", e, "] = ", counts[e], " but topk_idx routes ", actual[e],
              " tokens to expert ", e, "; pass the route_counts of this topk_idx");

  // cursor[e] = unclamped position of the next row of expert e in the expert-major order.
  std::vector<int64_t>& cursor = actual;
  int64_t total = 0;
  offsets[0] = 0;
  for (int64_t e = 0; e < N; ++e) {
    cursor[e] = total;
    total += counts[e];
    offsets[e + 1] = static_cast<int32_t>(total < rank_capacity ? total : rank_capacity);
  }
  // Visiting routes in (t, k) order places each expert's rows in token, then k, order.
  for (int64_t i = 0; i < routes; ++i) {
    const int64_t row = cursor[idx[i]]++;
    index[i] = row < rank_capacity ? static_cast<int32_t>(row) : -1;  // tail drop
  }
}

void accumulate_counts(Tensor load, Tensor counts, Stream /*stream*/) {
  constexpr const char* op = "accumulate_counts";
  check_f32(load, op, "load");
  MOE_CHECK(load.ndim() == 1, op, ": load must be [N], got ", load.shape.str());
  check_i32(counts, op, "counts");
  MOE_CHECK(counts.shape == load.shape, op, ": counts has shape ", counts.shape.str(), ", expected ", load.shape.str(),
            " (one count per expert of load)");
  float* l = load.f32();
  const int32_t* c = counts.i32();
  for (int64_t e = 0; e < load.numel(); ++e) l[e] += static_cast<float>(c[e]);
}

}  // namespace moe::cpu

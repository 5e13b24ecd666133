// Routing metadata on the rank: counts and the route index that places each (token, k) route
// in the expert-major buffer. This is the EP = 1 (local) form of the dispatch steps.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

// expert_counts [N] i32 (overwritten) = routes per expert in topk_idx [T, K].
void route_counts(Tensor expert_counts, Tensor topk_idx, Stream stream = {});

// Places routes in the expert-major buffer of one rank: rows are ordered by expert, then token t,
// then k; the cumulative row count is clamped at rank_capacity (tail drop), so a route whose row
// would land at or past rank_capacity is dropped.
//   route_index [T*K] i32: the buffer row of route (t, k) at index t*K + k, or -1 if dropped;
//   expert_offsets [N+1] i32: kept rows of expert e are [offsets[e], offsets[e+1]); offsets[N] = kept rows.
void route_index_local(Tensor route_index, Tensor expert_offsets, Tensor topk_idx, Tensor expert_counts,
                       int64_t rank_capacity, Stream stream = {});

// load[e] += counts[e]: routes per expert summed over the microbatches of a step (load F32 [N],
// counts I32 [N]). On the counts' device, so the per-step expert load is kept without a host read.
void accumulate_counts(Tensor load, Tensor counts, Stream stream = {});

}  // namespace moe

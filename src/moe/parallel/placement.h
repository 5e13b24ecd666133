// Expert-parallel placement: from the all-gathered counts of
// every rank, where each route's row lands. Pure host logic, identical on every rank of the EP
// group, shared by the rowwise and alltoall dispatchers (and their tests).
//
// Rank r of P holds experts [r*E, (r+1)*E), E = N/P. Each destination buffer has `rows`
// (rank_capacity, expert_buffers.h) rows. Tail drop: at destination d, rows are ordered local-expert-major, then
// source rank, then token order (t, then k); the cumulative count is clamped at `rows`. So the
// rows kept from source s for local expert e of d are the contiguous range
//   [start(d, e, s), start(d, e, s) + kept(d, e, s))
// and the kept rows of d are packed at the front of its buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moe {

struct Placement {
  int ranks = 0;              // P
  int64_t local_experts = 0;  // E
  int64_t rows = 0;           // rank_capacity
  std::vector<int64_t> start;    // [(d*E + e)*P + s]
  std::vector<int64_t> kept;     // [(d*E + e)*P + s]
  std::vector<int32_t> offsets;  // [d*(E+1) + e]: kept rows of local expert e of d are [offsets[e], offsets[e+1])
  std::vector<int64_t> cursor;   // scratch of assign_routes: [N]

  int64_t index(int d, int64_t e, int s) const { return (static_cast<int64_t>(d) * local_experts + e) * ranks + s; }
  int64_t start_of(int d, int64_t e, int s) const { return start[static_cast<size_t>(index(d, e, s))]; }
  int64_t kept_of(int d, int64_t e, int s) const { return kept[static_cast<size_t>(index(d, e, s))]; }
  const int32_t* offsets_of(int d) const { return offsets.data() + static_cast<int64_t>(d) * (local_experts + 1); }
  // Rows kept at destination d (= offsets_of(d)[E]).
  int64_t kept_rows(int d) const { return offsets_of(d)[local_experts]; }
  // Routes source s sends to d that d keeps (over all of d's local experts).
  int64_t kept_from(int d, int s) const;
};

// Fills `out` (its vectors are reused across calls, so a steady state allocates nothing) from
// counts [P*N] (counts[s*N + e] = routes rank s sends to expert e). N must be a multiple of P.
void compute_placement(Placement& out, const int32_t* counts, int ranks, int64_t num_experts, int64_t rows);

// Route index of rank `me` for its topk_idx [T, K]: the j-th route (in (t, k) order) of this rank
// to expert e gets dst_rank * rows + start(owner(e), e_local, me) + j when j < kept(...), else -1.
// Checks that topk_idx routes exactly counts[me] (the counts that went into `placement`).
// Uses placement.cursor as scratch.
void assign_routes(int32_t* route_index, const int32_t* topk_idx, int64_t tokens, int64_t top_k, Placement& placement,
                   const int32_t* my_counts, int me);

}  // namespace moe

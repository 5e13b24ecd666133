#include "moe/parallel/placement.h"

#include <algorithm>
#include <limits>

#include "moe/core/error.h"

namespace moe {

int64_t Placement::kept_from(int d, int s) const {
  int64_t n = 0;
  for (int64_t e = 0; e < local_experts; ++e) n += kept_of(d, e, s);
  return n;
}

void compute_placement(Placement& out, const int32_t* counts, int ranks, int64_t num_experts, int64_t rows) {
  MOE_CHECK(ranks >= 1 && num_experts >= 1 && num_experts % ranks == 0, "placement: ", num_experts,
            " experts do not split evenly over ", ranks, " EP ranks");
  MOE_CHECK(rows >= 0 && rows <= std::numeric_limits<int32_t>::max(), "placement: rank capacity ", rows,
            " does not fit I32 rows");
  const int P = ranks;
  const int64_t N = num_experts, E = N / P;
  out.ranks = P;
  out.local_experts = E;
  out.rows = rows;
  out.start.resize(static_cast<size_t>(P * E * P));
  out.kept.resize(static_cast<size_t>(P * E * P));
  out.offsets.resize(static_cast<size_t>(P * (E + 1)));
  for (int d = 0; d < P; ++d) {
    int32_t* offsets = out.offsets.data() + static_cast<int64_t>(d) * (E + 1);
    int64_t total = 0;  // unclamped rows before the current (e, s) block at d
    offsets[0] = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t expert = static_cast<int64_t>(d) * E + e;
      for (int s = 0; s < P; ++s) {
        const int32_t c = counts[static_cast<int64_t>(s) * N + expert];
        MOE_CHECK(c >= 0, "placement: rank ", s, " reports ", c, " routes to expert ", expert);
        const int64_t begin = std::min(total, rows), end = std::min(total + c, rows);
        const auto i = static_cast<size_t>(out.index(d, e, s));
        out.start[i] = begin;
        out.kept[i] = end - begin;
        total += c;
      }
      offsets[e + 1] = static_cast<int32_t>(std::min(total, rows));
    }
  }
}

void assign_routes(int32_t* route_index, const int32_t* topk_idx, int64_t tokens, int64_t top_k, Placement& placement,
                   const int32_t* my_counts, int me) {
  const int P = placement.ranks;
  const int64_t E = placement.local_experts, N = E * P, rows = placement.rows;
  MOE_CHECK(me >= 0 && me < P, "assign_routes: rank ", me, " is not in an EP group of ", P);
  MOE_CHECK(static_cast<int64_t>(P) * rows <= std::numeric_limits<int32_t>::max(), "assign_routes: ", P, " ranks x ",
            rows, " rows do not fit an I32 route index");
  auto& cursor = placement.cursor;
  cursor.assign(static_cast<size_t>(N), 0);
  const int64_t routes = tokens * top_k;
  for (int64_t i = 0; i < routes; ++i) {
    const int32_t expert = topk_idx[i];
    MOE_CHECK(expert >= 0 && expert < N, "assign_routes: topk_idx[", i / top_k, ", ", i % top_k, "] = ", expert,
              " is not an expert in [0, ", N, ")");
    const int d = static_cast<int>(expert / E);
    const int64_t e = expert % E, j = cursor[static_cast<size_t>(expert)]++;
    route_index[i] = j < placement.kept_of(d, e, me)
                         ? static_cast<int32_t>(static_cast<int64_t>(d) * rows + placement.start_of(d, e, me) + j)
                         : -1;
  }
  // The counts must be those of this topk_idx, or rows of one expert would land in another's.
  for (int64_t e = 0; e < N; ++e)
    MOE_CHECK(cursor[static_cast<size_t>(e)] == my_counts[e], "assign_routes (rank ", me, "): expert_counts[", e,
              "] = ", my_counts[e], " but topk_idx routes ", cursor[static_cast<size_t>(e)], " tokens to expert ", e,
              "; pass the route_counts of this topk_idx");
}

}  // namespace moe

// The bandwidth of moving routed rows between GPUs at one payload, timed on the compute stream
// (median of `iters` after `warmup`, CUDA events): the rowwise dispatch (rows stored into the
// owners' NCCL symmetric windows, plus its barrier), the rowwise combine (barrier, then each
// token's K rows loaded from their owners and summed), and NCCL's all-to-all of the same bytes.
// Routing is balanced: token t's k-th route goes to expert (t K + k) mod N, so every rank sends
// T K / P rows to every rank (itself included). Used by bench/dispatch_bench.cpp and by
// `moetrain bench --calibrate` (perf/calibrate.h). CUDA builds with NCCL only.
#pragma once

#include <cstdint>

#include "moe/comm/communicator.h"

namespace moe {

struct DispatchTimingShape {
  int64_t tokens = 16384;  // per rank
  int64_t hidden = 4096;   // row width, BF16
  int64_t top_k = 4;
  int64_t experts_per_rank = 8;
};

struct DispatchTimes {
  double dispatch_ms = 0, combine_ms = 0, all_to_all_ms = 0;
  double payload_bytes = 0;  // per rank per direction: tokens x top_k rows of hidden BF16
};

// Collective over `nccl` (an NCCL communicator, one rank per GPU of one host).
DispatchTimes time_rowwise_dispatch(Communicator& nccl, const DispatchTimingShape& shape, int warmup, int iters);

}  // namespace moe

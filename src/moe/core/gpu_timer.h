// GPU timing for benchmarks: CUDA events around each call of a piece of GPU work on a stream.
// CUDA builds only (MOE_HAVE_CUDA).
#pragma once

#if defined(MOE_HAVE_CUDA)
#include <cuda_runtime.h>

#include <functional>

namespace moe {

struct GpuTimes {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

// Runs fn `warmup` times, then `iters` (>= 1) times with an event pair around each call on
// `stream` (nullptr: the compute stream), waiting for each; fn must queue its work there.
GpuTimes time_gpu(int warmup, int iters, const std::function<void()>& fn, cudaStream_t stream = nullptr);

}  // namespace moe
#endif

#include "moe/core/gpu_timer.h"

#if defined(MOE_HAVE_CUDA)
#include <algorithm>
#include <vector>

#include "moe/core/cuda_check.h"
#include "moe/core/error.h"

namespace moe {

GpuTimes time_gpu(int warmup, int iters, const std::function<void()>& fn, cudaStream_t stream) {
  MOE_CHECK(iters >= 1 && warmup >= 0, "time_gpu: ", iters, " timed and ", warmup, " warm-up calls");
  const cudaStream_t s = stream != nullptr ? stream : compute_stream();
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    CUDA_CHECK(cudaEventRecord(e0, s));
    fn();
    CUDA_CHECK(cudaEventRecord(e1, s));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float m = 0;
    CUDA_CHECK(cudaEventElapsedTime(&m, e0, e1));
    ms.push_back(m);
  }
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back()};
}

}  // namespace moe
#endif

#include "moe/core/pass_timer.h"

#include "moe/core/error.h"

#if defined(MOE_HAVE_CUDA)
#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"
#endif

namespace moe {

PassTimer::~PassTimer() {
#if defined(MOE_HAVE_CUDA)
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));  // no throwing from a destructor
#endif
}

void PassTimer::record() {
#if defined(MOE_HAVE_CUDA)
  if (used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events_[used_++]), compute_stream()));
#else
  MOE_FAIL("PassTimer: a GPU phase in a build without the CUDA backend");
#endif
}

void PassTimer::start() {
  host_ = PassTimes{};
  used_ = 0;
  if (device_ == Device::CUDA)
    record();
  else
    start_ = SteadyClock::now();
}

void PassTimer::begin_pass() {
  if (device_ == Device::CUDA)
    record();
  else
    pass_start_ = SteadyClock::now();
}

void PassTimer::end_pass() {
  if (device_ == Device::CUDA)
    record();
  else
    host_.busy_s += seconds_since(pass_start_);
}

void PassTimer::stop() {
  if (device_ == Device::CUDA)
    record();
  else
    host_.wall_s = seconds_since(start_);
}

PassTimes PassTimer::read() const {
  if (device_ != Device::CUDA) return host_;
  PassTimes t;
#if defined(MOE_HAVE_CUDA)
  if (used_ < 2) return t;
  auto ms = [&](size_t a, size_t b) {
    float v = 0;
    CUDA_CHECK(cudaEventElapsedTime(&v, static_cast<cudaEvent_t>(events_[a]), static_cast<cudaEvent_t>(events_[b])));
    return static_cast<double>(v) / 1e3;
  };
  for (size_t k = 1; k + 2 < used_; k += 2) t.busy_s += ms(k, k + 1);
  t.wall_s = ms(0, used_ - 1);
#endif
  return t;
}

}  // namespace moe

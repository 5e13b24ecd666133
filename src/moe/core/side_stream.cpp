#include "moe/core/side_stream.h"

#include "moe/core/error.h"

#if defined(MOE_HAVE_CUDA)
#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"
#endif

namespace moe {

#if defined(MOE_HAVE_CUDA)
namespace {
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }
cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}
}  // namespace
#endif

SideStream::SideStream(Device device) {
  if (device != Device::CUDA) return;
#if defined(MOE_HAVE_CUDA)
  cudaStream_t s = nullptr;
  // Non-blocking: the side stream must not serialize with the legacy default stream either.
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  fork_ = new_event();
  done_ = new_event();
#else
  MOE_FAIL("SideStream: a CUDA stream needs the CUDA backend, which this build does not have");
#endif
}

SideStream::~SideStream() {
#if defined(MOE_HAVE_CUDA)
  if (!stream_) return;
  for (void* e : marks_) cudaEventDestroy(as_event(e));  // no throwing from a destructor
  cudaEventDestroy(as_event(done_));
  cudaEventDestroy(as_event(fork_));
  cudaStreamDestroy(as_stream(stream_));
#endif
}

void SideStream::follow_compute() {
#if defined(MOE_HAVE_CUDA)
  if (!stream_) return;
  CUDA_CHECK(cudaEventRecord(as_event(fork_), compute_stream()));
  CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream_), as_event(fork_), 0));
#endif
}

int SideStream::mark() {
#if defined(MOE_HAVE_CUDA)
  if (!stream_) return -1;
  if (used_ == marks_.size()) marks_.push_back(new_event());
  CUDA_CHECK(cudaEventRecord(as_event(marks_[used_]), as_stream(stream_)));
  return static_cast<int>(used_++);
#else
  return -1;
#endif
}

void SideStream::compute_waits(int mark) {
  if (mark < 0) return;
#if defined(MOE_HAVE_CUDA)
  MOE_CHECK(static_cast<size_t>(mark) < used_, "SideStream: mark ", mark, " is not one of the ", used_, " current marks");
  CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), as_event(marks_[static_cast<size_t>(mark)]), 0));
#endif
}

void SideStream::join() {
#if defined(MOE_HAVE_CUDA)
  if (!stream_) return;
  CUDA_CHECK(cudaEventRecord(as_event(done_), as_stream(stream_)));
  CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), as_event(done_), 0));
#endif
}

}  // namespace moe

// SideStream: a second CUDA stream beside the compute stream, ordered against it only by events
// (record / wait pairs: a CUDA graph captures them and the host never waits). Used for work that
// should run beside the computation: the gradient reduction's collectives (comm/comm_queue.h) and
// the pipeline's stage messages (train/pipeline_executor.cpp). On the CPU there is no second
// stream: every call does nothing and the caller's work runs in program order.
#pragma once

#include <vector>

#include "moe/core/dtype.h"
#include "moe/core/stream.h"

namespace moe {

class SideStream {
 public:
  explicit SideStream(Device device);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  bool active() const { return stream_ != nullptr; }  // false on the CPU
  Stream stream() const { return Stream{stream_}; }   // empty on the CPU
  // The side stream waits for everything queued on the compute stream so far.
  void follow_compute();
  // Marks the side stream's current end; the compute stream can wait for the work before it with
  // compute_waits. Marks stay valid until forget_marks (-1 on the CPU).
  int mark();
  void compute_waits(int mark);
  // The compute stream waits for everything queued on the side stream so far.
  void join();
  // Earlier marks are not used again (their events are reused: a wait already queued keeps the
  // record it saw).
  void forget_marks() { used_ = 0; }

 private:
  void* stream_ = nullptr;           // cudaStream_t
  void* fork_ = nullptr;             // cudaEvent_t on the compute stream, for follow_compute
  void* done_ = nullptr;             // cudaEvent_t on the side stream, for join
  std::vector<void*> marks_;         // cudaEvent_t on the side stream, one per mark
  size_t used_ = 0;
};

}  // namespace moe

// Times a phase of work made of passes (the pipeline's forward and backward passes, with waits for
// messages between them): the time inside passes and the time of the whole phase. On the CPU the
// host clock brackets each pass. On the GPU the host only queues the work, so CUDA events on the
// compute stream bracket each pass instead, and the times are read once the device has finished
// (after the step's read of its statistics): no wait inside the step.
#pragma once

#include <vector>

#include "moe/core/wall_clock.h"
#include "moe/core/dtype.h"

namespace moe {

struct PassTimes {
  double busy_s = 0;  // inside passes
  double wall_s = 0;  // the whole phase, waits included
  // The phase's idle share: 1 - busy / wall.
  double idle() const { return wall_s > 0 ? 1.0 - busy_s / wall_s : 0.0; }
};

class PassTimer {
 public:
  explicit PassTimer(Device device) : device_(device) {}
  ~PassTimer();
  PassTimer(const PassTimer&) = delete;
  PassTimer& operator=(const PassTimer&) = delete;

  void start();  // the phase begins (forgets the previous phase)
  void begin_pass();
  void end_pass();
  void stop();  // the phase ends
  // The last phase's times; on the GPU, once the device has finished it.
  PassTimes read() const;

 private:
  void record();  // the next event on the compute stream (created on first use, reused after)
  Device device_;
  SteadyClock::time_point start_, pass_start_;
  PassTimes host_;
  std::vector<void*> events_;  // cudaEvent_t: start, then begin / end of each pass, then stop
  size_t used_ = 0;
};

}  // namespace moe

// CommQueue: runs communication work beside the computation, in the order it was submitted, so
// that a collective started in the middle of the backward overlaps the rest of it.
//   CPU: a worker thread runs the tasks. Its collectives must go to communicators of their own
//        (made for the queue, e.g. by split) whose backend allows calls from a second thread
//        (Communicator::threads_may_call_concurrently); without that the queue runs each task
//        inside submit(), on the caller's thread (the same results, no overlap).
//   GPU: a second stream runs them. submit() orders that stream after everything queued on the
//        compute stream so far and calls the task with it on the host (the task queues its
//        work there); join() orders the compute stream after everything submitted. Both are
//        event record/wait pairs, so a CUDA graph captures the fork and the join, and nothing
//        waits on the host.
#pragma once

#include <functional>
#include <memory>

#include "moe/core/side_stream.h"
#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

class CommQueue {
 public:
  // device: where the tasks' buffers live. threaded (CPU only): run the tasks on a worker
  // thread. clock: when given, the host time join() waits is added to it (exposed communication
  // time, the same clock TimedCommunicator adds to).
  CommQueue(Device device, bool threaded, std::shared_ptr<double> clock = nullptr);
  ~CommQueue();
  CommQueue(const CommQueue&) = delete;
  CommQueue& operator=(const CommQueue&) = delete;

  // A task receives the stream to queue its work on (empty on the CPU).
  using Task = std::function<void(Stream)>;
  void submit(Task task);
  // CPU: returns once every submitted task has run, rethrowing the first task's error (the tasks
  // after a failed one are dropped). GPU: the compute stream waits for the side stream.
  void join();
  // Whether tasks run beside the caller (a worker thread or a second stream).
  bool overlaps() const;

 private:
  struct Worker;  // the CPU worker thread and its task list
  std::shared_ptr<double> clock_;
  std::shared_ptr<Worker> worker_;  // shared with the thread, which may outlive an unwinding queue
  std::unique_ptr<SideStream> side_;  // the GPU's second stream
};

}  // namespace moe

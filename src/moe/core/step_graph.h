// StepGraph: one training step recorded as a CUDA graph and replayed. capture() runs `body`
// with the compute stream in capture mode: every op it queues is recorded, nothing executes,
// and any host synchronization or device-to-host copy inside it fails the capture (the proof
// that a step has none). replay() launches the recorded step; values that change between steps
// (batch tokens, learning rate, step count) must live in device memory the graph reads.
#pragma once

#include <functional>

namespace moe {

class StepGraph {
 public:
  StepGraph() = default;
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Records body's work on the compute stream (CUDA builds only; fails on CPU-only builds).
  void capture(const std::function<void()>& body);
  // Launches the recorded step on the compute stream (asynchronous).
  void replay();
  bool captured() const { return exec_ != nullptr; }
  // Kernel and memcpy nodes in the captured graph (reports, tests).
  size_t nodes() const { return nodes_; }

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  size_t nodes_ = 0;
};

}  // namespace moe

#include "moe/core/step_graph.h"

#include "moe/core/error.h"

#if defined(MOE_HAVE_CUDA)
#include "moe/core/cuda_check.h"
#endif

namespace moe {

#if defined(MOE_HAVE_CUDA)

StepGraph::~StepGraph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));  // no throwing from a destructor
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

void StepGraph::capture(const std::function<void()>& body) {
  MOE_CHECK(exec_ == nullptr, "StepGraph::capture: a step is already captured");
  const cudaStream_t s = compute_stream();
  // Global mode: a synchronizing call from any thread during the capture is an error, not a
  // silent stall, so a host round trip hidden in a step cannot go unnoticed.
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaGraph_t graph = nullptr;
  try {
    body();
  } catch (...) {
    cudaStreamEndCapture(s, &graph);  // leave the stream usable; the error that stopped the body wins
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  MOE_CHECK(end == cudaSuccess && graph != nullptr, "CUDA graph capture of the training step failed: ",
            cudaGetErrorString(end),
            " (an op in the step synchronized with the host or used the legacy default stream)");
  graph_ = graph;
  CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes_));
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  exec_ = exec;
}

void StepGraph::replay() {
  MOE_CHECK(exec_ != nullptr, "StepGraph::replay: nothing captured");
  CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), compute_stream()));
}

#else

StepGraph::~StepGraph() = default;

void StepGraph::capture(const std::function<void()>&) {
  MOE_FAIL("CUDA graphs need a build with the CUDA backend (MOE_CUDA=ON)");
}

void StepGraph::replay() { MOE_FAIL("CUDA graphs need a build with the CUDA backend (MOE_CUDA=ON)"); }

#endif

}  // namespace moe

#include "moe/train/device_choice.h"

#include "moe/comm/agreed_outcome.h"
#include "moe/comm/nccl_communicator.h"
#include "moe/core/device.h"
#include "moe/core/error.h"

namespace moe {

RunDevice choose_device(const Config& cfg, Communicator& world) {
  RunDevice r;
  std::string why, nccl_why;
  const bool gpu = cuda_available(&why);
  const bool nccl = gpu && nccl_available(&nccl_why);
  const std::string& want = cfg.run.device;
  const int ranks = world.size();
  if (want == "cpu") {
    r.note = "cpu (run.device)";
    return r;
  }
  if (want == "auto") {
    std::string reason;
    if (!gpu)
      reason = why;
    else if (ranks > 1 && !nccl)
      reason = "several ranks on GPUs need NCCL: " + nccl_why;
    else if (ranks > 1 && cfg.parallel.ep > 1 && cfg.ep.backend != "rowwise")
      reason = "ep.backend = " + cfg.ep.backend + " runs on the CPU (the GPU has the rowwise backend)";
    if (!reason.empty()) {
      r.note = "cpu (run.device = auto: " + reason + ")";
      return r;
    }
  } else {
    // Usually every rank's answer (one build, alike machines): printed once then.
    agree_on_outcome(world, [&] {
      MOE_CHECK(gpu, "run.device = \"cuda\", but ", why);
      MOE_CHECK(ranks == 1 || nccl, "run.device = \"cuda\" with ", ranks, " ranks needs NCCL: ", nccl_why);
    });
  }
  if (ranks > 1) select_local_gpu();
  r.device = Device::CUDA;
  r.note = std::string("cuda (") + (want == "auto" ? "run.device = auto" : "run.device") + "; collectives " +
           (nccl ? "through NCCL" : "in-process (one rank; NCCL: " + nccl_why + ")") + ")";
  if (nccl) r.gpu_world = make_nccl_communicator(world);
  return r;
}

}  // namespace moe

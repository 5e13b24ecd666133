#include "moe/parallel/dispatcher_factory.h"

#include "moe/core/error.h"
#include "moe/parallel/alltoall_dispatcher.h"
#if defined(MOE_HAVE_CUDA)
#include "moe/parallel/cuda_rowwise_dispatcher.h"
#endif
#include "moe/parallel/local_dispatcher.h"
#include "moe/parallel/rowwise_dispatcher.h"

namespace moe {

std::unique_ptr<TokenDispatcher> make_dispatcher(const std::string& backend, Communicator& ep_group,
                                                 int64_t num_experts, double capacity_factor, bool dropless) {
  if (backend == "local") {
    MOE_CHECK(ep_group.size() == 1, "dispatch backend 'local' (ep.backend) holds every expert on one rank, but the EP "
              "group has ", ep_group.size(), " ranks; use rowwise or alltoall");
    return std::make_unique<LocalDispatcher>(num_experts, capacity_factor, dropless);
  }
  if (backend == "rowwise") return std::make_unique<RowwiseDispatcher>(ep_group, num_experts, capacity_factor, dropless);
  if (backend == "alltoall")
    return std::make_unique<AllToAllDispatcher>(ep_group, num_experts, capacity_factor, dropless);
  MOE_FAIL("unknown dispatch backend '", backend, "' (ep.backend); choose one of: local, rowwise, alltoall");
}

std::unique_ptr<TokenDispatcher> make_gpu_dispatcher(const std::string& backend, Communicator& ep_group,
                                                     int64_t num_experts, double capacity_factor, bool dropless) {
  if (backend == "rowwise") {
#if defined(MOE_HAVE_CUDA)
    return std::make_unique<CudaRowwiseDispatcher>(ep_group, num_experts, capacity_factor, dropless);
#else
    (void)ep_group, (void)num_experts, (void)capacity_factor, (void)dropless;
    MOE_FAIL("dispatch backend 'rowwise' on the GPU (ep.backend): this binary was built without CUDA");
#endif
  }
  if (backend == "alltoall")
    MOE_FAIL("dispatch backend 'alltoall' (ep.backend) is not available on the GPU: its host-side split counts need "
             "a device-to-host copy per layer, which a CUDA-graph step cannot make; use rowwise");
  MOE_FAIL("unknown dispatch backend '", backend, "' (ep.backend); on the GPU choose rowwise");
}

std::unique_ptr<TokenDispatcher> make_run_dispatcher(Device device, bool device_collectives, bool has_moe_layers,
                                                     const std::string& backend, Communicator* ep_group,
                                                     int64_t num_experts, double capacity_factor, bool dropless) {
  if (ep_group == nullptr) return std::make_unique<LocalDispatcher>(num_experts, capacity_factor, dropless);
  if (device == Device::CUDA && device_collectives && has_moe_layers && backend == "rowwise")
    return make_gpu_dispatcher(backend, *ep_group, num_experts, capacity_factor, dropless);
  if (ep_group->size() == 1) return std::make_unique<LocalDispatcher>(num_experts, capacity_factor, dropless);
  if (device == Device::CUDA) return make_gpu_dispatcher(backend, *ep_group, num_experts, capacity_factor, dropless);
  return make_dispatcher(backend, *ep_group, num_experts, capacity_factor, dropless);
}

}  // namespace moe

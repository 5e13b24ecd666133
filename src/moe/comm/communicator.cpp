// The default point-to-point calls: refused, naming the backend's missing support, for
// communicators that have none (the in-process one and the planning stand-in).
#include "moe/comm/communicator.h"

#include "moe/core/error.h"

namespace moe {

void Communicator::send(Tensor, int peer, int, Stream) {
  MOE_FAIL("send to rank ", peer, ": this communicator has no point-to-point messages (pipeline parallelism runs "
           "on MPI ranks or NCCL GPUs)");
}

void Communicator::recv(Tensor, int peer, int, Stream) {
  MOE_FAIL("recv from rank ", peer, ": this communicator has no point-to-point messages (pipeline parallelism "
           "runs on MPI ranks or NCCL GPUs)");
}

}  // namespace moe

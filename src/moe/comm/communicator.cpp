// The default point-to-point calls: refused, naming the backend's missing support, for
// communicators that have none (the NCCL one, so a pipeline run on the GPU is refused before it
// starts; see Trainer).
#include "moe/comm/communicator.h"

#include "moe/core/error.h"

namespace moe {

void Communicator::send(Tensor, int peer, int, Stream) {
  MOE_FAIL("send to rank ", peer, ": this communicator has no point-to-point messages (pipeline parallelism runs "
           "on MPI CPU ranks)");
}

void Communicator::recv(Tensor, int peer, int, Stream) {
  MOE_FAIL("recv from rank ", peer, ": this communicator has no point-to-point messages (pipeline parallelism "
           "runs on MPI CPU ranks)");
}

}  // namespace moe

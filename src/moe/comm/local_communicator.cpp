#include "moe/comm/local_communicator.h"

#include <cstring>

#include "moe/comm/collective_checks.h"
#include "moe/core/device.h"

namespace moe {

using namespace comm_detail;

namespace {
// in and out may be the same buffer (an in-place call). GPU buffers are copied on the compute
// stream, so a single-GPU run uses this communicator without a host round trip.
void copy_elements(Tensor out, const Tensor& in) { copy_bytes(out, in); }
}  // namespace

void LocalCommunicator::all_reduce(Tensor buf, ReduceOp, Stream) {
  check_cpu_tensor("all_reduce", "buf", buf, 0, /*any_device=*/true);
}

void LocalCommunicator::reduce_scatter(Tensor out, Tensor in, ReduceOp, Stream) {
  check_reduce_scatter(out, in, 1, 0, /*any_device=*/true);
  copy_elements(out, in);
}

void LocalCommunicator::all_gather(Tensor out, Tensor in, Stream) {
  check_all_gather(out, in, 1, 0, /*any_device=*/true);
  copy_elements(out, in);
}

void LocalCommunicator::all_to_all_v(Tensor out, const std::vector<int64_t>& recv_counts, Tensor in,
                                     const std::vector<int64_t>& send_counts, Stream) {
  check_all_to_all_v(out, recv_counts, in, send_counts, 1, 0, /*any_device=*/true);
  MOE_CHECK(send_counts[0] == recv_counts[0], "all_to_all_v (rank 0): one rank sends ",
            send_counts[0], " elements to itself but expects to receive ", recv_counts[0]);
  copy_elements(out, in);
}

void LocalCommunicator::broadcast(Tensor buf, int root, Stream) {
  check_cpu_tensor("broadcast", "buf", buf, 0, /*any_device=*/true);
  check_root(root, 1, 0);
}

void LocalCommunicator::send(Tensor, int peer, int, Stream) {
  MOE_FAIL("send (rank 0): peer ", peer, " must be another rank of this group of 1");
}

void LocalCommunicator::recv(Tensor, int peer, int, Stream) {
  MOE_FAIL("recv (rank 0): peer ", peer, " must be another rank of this group of 1");
}

std::unique_ptr<Communicator> LocalCommunicator::split(int color, int) {
  MOE_CHECK(color >= 0, "split (rank 0): color ", color, " must be non-negative");
  return std::make_unique<LocalCommunicator>();
}

}  // namespace moe

// dispatch_bench: the bandwidth of moving routed rows between GPUs (issue 7), under mpirun with one
// rank per GPU of one host. At the same payload per rank it times:
//   rowwise dispatch   rows stored into the owners' NCCL symmetric windows (CudaRowwiseDispatcher,
//                      LSA pointers) plus its barrier;
//   rowwise combine    the barrier plus the weighted sum of each token's K rows loaded from the owners;
//   NCCL all-to-all    the same bytes with ncclSend/ncclRecv (NcclCommunicator::all_to_all_v, host
//                      counts): what the alltoall design moves, and the NVLink all-to-all bandwidth
//                      this host reaches.
// Routing is balanced: token t's k-th route goes to expert (t K + k) mod N, so every rank sends
// T K / P rows to every rank (itself included). Bandwidth = payload bytes per rank (T K rows of D
// BF16) / time, the bytes that cross NVLink being (P - 1) / P of it. The CPU `alltoall` backend
// has no GPU version (its host split counts would cost a device-to-host copy per layer), so it is
// not timed here. Median of --iters after --warmup, CUDA events on the compute stream.
#include <CLI/CLI.hpp>
#include <cuda_runtime.h>

#include <cstdio>
#include <memory>

#include "moe/comm/launcher.h"
#include "moe/comm/local_communicator.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/comm/nccl_communicator.h"
#include "moe/core/cuda_check.h"
#include "moe/core/device.h"
#include "moe/parallel/dispatch_timing.h"


int main(int argc, char** argv) {
  using namespace moe;
  int64_t T = 16384, D = 4096, K = 4, experts_per_rank = 8;
  int iters = 20, warmup = 5;
  CLI::App app{"dispatch_bench: rowwise dispatch/combine vs NCCL all-to-all bandwidth between GPUs"};
  app.add_option("--tokens", T, "tokens per rank")->capture_default_str();
  app.add_option("--hidden", D, "row width (BF16 elements)")->capture_default_str();
  app.add_option("--topk", K)->capture_default_str();
  app.add_option("--experts-per-rank", experts_per_rank)->capture_default_str();
  app.add_option("--iters", iters)->capture_default_str();
  app.add_option("--warmup", warmup)->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<MpiRuntime> mpi;
  LocalCommunicator local;
  if (detect_launcher().kind == Launcher::Mpi) mpi = std::make_unique<MpiRuntime>(&argc, &argv);
  Communicator& world = mpi ? mpi->world() : static_cast<Communicator&>(local);
  try {
    std::string why;
    MOE_CHECK(cuda_available(&why), "dispatch_bench needs a GPU: ", why);
    MOE_CHECK(nccl_available(&why), "dispatch_bench needs NCCL: ", why);
    if (world.size() > 1) select_local_gpu();
    const std::unique_ptr<Communicator> nccl = make_nccl_communicator(world);
    const int P = nccl->size(), me = nccl->rank();
    DispatchTimingShape shape;
    shape.tokens = T, shape.hidden = D, shape.top_k = K, shape.experts_per_rank = experts_per_rank;
    const DispatchTimes times = time_rowwise_dispatch(*nccl, shape, warmup, iters);
    const int64_t N = experts_per_rank * P;
    const double dispatch_ms = times.dispatch_ms, combine_ms = times.combine_ms, a2a_ms = times.all_to_all_ms;
    const double payload = times.payload_bytes;  // bytes per rank
    auto gbps = [&](double ms) { return payload / (ms * 1e-3) / 1e9; };
    if (me == 0) {
      std::printf("dispatch_bench: %d ranks, %ld tokens x top-%ld per rank, D %ld (BF16), %ld experts: %.1f MiB "
                  "payload per rank per direction (%.0f%% of it to other GPUs)\n",
                  P, static_cast<long>(T), static_cast<long>(K), static_cast<long>(D), static_cast<long>(N),
                  payload / (1 << 20), 100.0 * (P - 1) / P);
      std::printf("  %-20s %9.3f ms  %8.1f GB/s per rank\n", "rowwise dispatch", dispatch_ms, gbps(dispatch_ms));
      std::printf("  %-20s %9.3f ms  %8.1f GB/s per rank\n", "rowwise combine", combine_ms, gbps(combine_ms));
      std::printf("  %-20s %9.3f ms  %8.1f GB/s per rank\n", "NCCL all-to-all", a2a_ms, gbps(a2a_ms));
      std::printf("  alltoall backend: CPU only (not timed on GPUs)\n");
      std::printf("RESULT_JSON {\"bench\": \"dispatch\", \"ranks\": %d, \"tokens\": %ld, \"topk\": %ld, \"hidden\": %ld, "
                  "\"payload_bytes\": %.0f, \"rowwise_dispatch_ms\": %.4f, \"rowwise_combine_ms\": %.4f, "
                  "\"nccl_all_to_all_ms\": %.4f}\n",
                  P, static_cast<long>(T), static_cast<long>(K), static_cast<long>(D), payload, dispatch_ms,
                  combine_ms, a2a_ms);
    }
  } catch (const std::exception& e) {
    if (mpi && world.size() > 1) MpiRuntime::abort_job(e.what(), 1);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

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
#include <vector>

#include "moe/comm/launcher.h"
#include "moe/comm/local_communicator.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/comm/nccl_communicator.h"
#include "moe/core/arena.h"
#include "moe/core/cuda_check.h"
#include "moe/core/device.h"
#include "moe/core/gpu_timer.h"
#include "moe/ops/elementwise.h"
#include "moe/parallel/cuda_rowwise_dispatcher.h"


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
    const int64_t N = experts_per_rank * P, routes = T * K;
    MOE_CHECK(routes % P == 0, "tokens x topk = ", routes, " must be a multiple of the ", P, " ranks");

    CudaRowwiseDispatcher rowwise(*nccl, N, /*capacity_factor=*/1.0, /*dropless=*/true);
    Arena arena("dispatch bench", Device::CUDA);
    DispatchShape shape;
    shape.tokens = T, shape.top_k = K, shape.hidden = D, shape.num_layers = 1, shape.slots_per_layer = 1,
    shape.first_layer = 0, shape.dtype = DType::BF16;
    rowwise.reserve_buffers(shape, arena);
    const auto topk_s = arena.reserve("topk", DType::I32, {T, K}), counts_s = arena.reserve("counts", DType::I32, {N});
    const auto weights_s = arena.reserve("weights", DType::F32, {T, K});
    const auto route_s = arena.reserve("route_index", DType::I32, {routes});
    const auto offsets_s = arena.reserve("offsets", DType::I32, {experts_per_rank + 1});
    const auto x_s = arena.reserve("x", DType::BF16, {T, D}), out_s = arena.reserve("out", DType::BF16, {T, D});
    const auto send_s = arena.reserve("a2a.send", DType::BF16, {routes, D});
    const auto recv_s = arena.reserve("a2a.recv", DType::BF16, {routes, D});
    arena.commit();

    // Balanced routing, the same on every rank: expert (t K + k) mod N.
    std::vector<int32_t> topk(static_cast<size_t>(routes)), counts(static_cast<size_t>(N), 0);
    for (int64_t i = 0; i < routes; ++i) {
      topk[static_cast<size_t>(i)] = static_cast<int32_t>(i % N);
      ++counts[static_cast<size_t>(i % N)];
    }
    copy_to_tensor(arena.get(topk_s), topk.data());
    copy_to_tensor(arena.get(counts_s), counts.data());
    std::vector<float> ones(static_cast<size_t>(routes), 1.0f);
    copy_to_tensor(arena.get(weights_s), ones.data());
    fill_zero(arena.get(x_s));
    fill_zero(arena.get(send_s));

    const RoutePlan plan{arena.get(route_s), arena.get(offsets_s)};
    rowwise.place_routes(/*layer=*/0, plan, arena.get(topk_s), arena.get(counts_s), {});
    rowwise.check_after_step();  // the device's count check of the routing above
    const Lease lease = rowwise.acquire(0);
    const Tensor x = arena.get(x_s), out = arena.get(out_s), weights = arena.get(weights_s);
    nccl->barrier();
    const double dispatch_ms = time_gpu(warmup, iters, [&] {
                                 rowwise.dispatch(lease.buffers.expert_in, x, plan, static_cast<int>(K), {});
                               }).median_ms;
    const double combine_ms = time_gpu(warmup, iters, [&] {
                                rowwise.combine(out, lease.buffers.expert_out, weights, plan, static_cast<int>(K), {});
                              }).median_ms;
    rowwise.release(lease);
    const std::vector<int64_t> per_peer(static_cast<size_t>(P), routes / P * D);
    const Tensor send = arena.get(send_s), recv = arena.get(recv_s);
    const double a2a_ms =
        time_gpu(warmup, iters, [&] { nccl->all_to_all_v(recv, per_peer, send, per_peer); }).median_ms;

    const double payload = static_cast<double>(routes) * static_cast<double>(D) * 2.0;  // bytes per rank
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

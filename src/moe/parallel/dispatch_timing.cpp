#include "moe/parallel/dispatch_timing.h"

#if defined(MOE_HAVE_CUDA) && defined(MOE_HAVE_NCCL)
#include <vector>

#include "moe/core/arena.h"
#include "moe/core/device.h"
#include "moe/core/error.h"
#include "moe/core/gpu_timer.h"
#include "moe/ops/elementwise.h"
#include "moe/parallel/cuda_rowwise_dispatcher.h"
#else
#include "moe/core/error.h"
#endif

namespace moe {

DispatchTimes time_rowwise_dispatch(Communicator& nccl, const DispatchTimingShape& s, int warmup, int iters) {
#if defined(MOE_HAVE_CUDA) && defined(MOE_HAVE_NCCL)
  const int64_t T = s.tokens, D = s.hidden, K = s.top_k, experts_per_rank = s.experts_per_rank;
  const int P = nccl.size();
  const int64_t N = experts_per_rank * P, routes = T * K;
  MOE_CHECK(routes % P == 0, "tokens x topk = ", routes, " must be a multiple of the ", P, " ranks");

  CudaRowwiseDispatcher rowwise(nccl, N, /*capacity_factor=*/1.0, /*dropless=*/true);
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
  nccl.barrier();
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
    time_gpu(warmup, iters, [&] { nccl.all_to_all_v(recv, per_peer, send, per_peer); }).median_ms;

  DispatchTimes t;
  t.dispatch_ms = dispatch_ms, t.combine_ms = combine_ms, t.all_to_all_ms = a2a_ms;
  t.payload_bytes = static_cast<double>(routes) * static_cast<double>(D) * 2.0;
  return t;
#else
  (void)nccl, (void)s, (void)warmup, (void)iters;
  MOE_FAIL("timing the rowwise dispatch needs a build with CUDA and NCCL");
#endif
}

}  // namespace moe

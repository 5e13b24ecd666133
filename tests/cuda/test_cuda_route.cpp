// CUDA routing metadata against the CPU: route_counts and route_index_local on random top-K
// selections (T in {1, 37, 4096} and T*K = 262144; N in {8, 64, 128}; K in {1, 2, 8, N}), with an
// expert that gets no route, capacities that force drops (down to 0) and ones that do not
// (including one past the I32 range), and selections read off a 16-byte boundary. The GPU pipeline
// runs device-only: its counts feed its route index. Every output is integer and must equal the
// CPU's exactly; two runs must be identical.
// accumulate_counts (FP32 sums of integer counts) must equal the CPU's exactly too.
//
// NOTES: DeviceBuffer's poison (0xff bytes) reads as -1 in I32, which is also the "dropped" value of
// route_index, so outputs are pre-filled with -7 instead: a route left unwritten shows up.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "cuda_test_util.h"
#include "moe/ops/route.h"
#include "../unit/routing_test_util.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;

constexpr int32_t kUnwritten = -7;

// Runs both ops on the CPU and (twice) on the GPU for one selection and capacity. lead: the device
// selection starts that many I32 elements into its buffer (1: off a 16-byte boundary, so the route
// index reads it without 16-byte loads).
void check_route(const std::vector<int32_t>& topk, int T, int N, int K, int64_t capacity, int lead = 0) {
  SCOPED_TRACE(::testing::Message() << "T=" << T << " N=" << N << " K=" << K << " capacity=" << capacity
                                    << " lead=" << lead);
  const int routes = T * K;
  std::vector<int32_t> idx = topk, counts_ref(N), index_ref(routes), offsets_ref(N + 1);
  route_counts(i32_tensor(counts_ref.data(), {N}), i32_tensor(idx.data(), {T, K}));
  route_index_local(i32_tensor(index_ref.data(), {routes}), i32_tensor(offsets_ref.data(), {N + 1}),
                    i32_tensor(idx.data(), {T, K}), i32_tensor(counts_ref.data(), {N}), capacity);

  DeviceBuffer topk_buffer(DType::I32, {lead + routes});
  std::vector<int32_t> padded(static_cast<size_t>(lead), 0);
  padded.insert(padded.end(), topk.begin(), topk.end());
  topk_buffer.upload_i32(padded);
  const Tensor topk_d(static_cast<int32_t*>(topk_buffer.tensor().data) + lead, DType::I32, {T, K}, Device::CUDA);
  std::vector<int32_t> first_counts, first_index, first_offsets;
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer counts_d(DType::I32, {N}), index_d(DType::I32, {routes}), offsets_d(DType::I32, {N + 1});
    counts_d.upload_i32(std::vector<int32_t>(N, kUnwritten));
    index_d.upload_i32(std::vector<int32_t>(routes, kUnwritten));
    offsets_d.upload_i32(std::vector<int32_t>(N + 1, kUnwritten));
    route_counts(counts_d, topk_d);
    route_index_local(index_d, offsets_d, topk_d, counts_d, capacity);  // device counts feed the index
    const std::vector<int32_t> counts = counts_d.download_i32(), index = index_d.download_i32(),
                               offsets = offsets_d.download_i32();
    if (run == 0) {
      EXPECT_EQ(counts, counts_ref) << "expert_counts";
      EXPECT_EQ(offsets, offsets_ref) << "expert_offsets";
      int mismatches = 0;
      for (int i = 0; i < routes; ++i)
        if (index[i] != index_ref[i] && ++mismatches <= 5)
          ADD_FAILURE() << "route_index[" << i << "] = " << index[i] << ", CPU " << index_ref[i];
      EXPECT_EQ(mismatches, 0);
      first_counts = counts;
      first_index = index;
      first_offsets = offsets;
    } else {
      EXPECT_EQ(counts, first_counts) << "expert_counts differ between two runs";
      EXPECT_EQ(index, first_index) << "route_index differs between two runs";
      EXPECT_EQ(offsets, first_offsets) << "expert_offsets differ between two runs";
    }
  }
}
#endif

TEST(CudaRoute, CountsAndIndexMatchCpuWithAndWithoutDrops) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  uint64_t seed = 1;
  for (int T : {1, 37, 4096})
    for (int N : {8, 64, 128})
      for (int K : {1, 2, 8, N}) {
        if (K > N || (K == N && K == 8)) continue;
        const int empty_expert = N / 2;  // gets no route when K < N
        const std::vector<int32_t> topk = testing::random_topk(T, N, K, ++seed, empty_expert);
        const int64_t routes = static_cast<int64_t>(T) * K;
        for (int64_t capacity : {routes, (routes * 5 + 3) / 4, routes * 3 / 4, routes / 2, int64_t{1}, int64_t{0},
                                 int64_t{1} << 40})
          check_route(topk, T, N, K, capacity);
      }
#endif
}

TEST(CudaRoute, CountsAndIndexMatchCpuAtFullScale) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  // T*K = 262144 routes over 128 experts: many chunks per expert block.
  const int T = 32768, N = 128, K = 8;
  const std::vector<int32_t> topk = testing::random_topk(T, N, K, 77, 5);
  for (int64_t capacity : {int64_t{T} * K, int64_t{T} * K * 5 / 4, int64_t{T} * K * 9 / 10, int64_t{1000}})
    check_route(topk, T, N, K, capacity);
  for (int lead : {1, 4}) check_route(topk, T, N, K, T * K * 9 / 10, lead);  // scalar and 16-byte loads at an offset
  // 37 x 8 = 296 routes: segments of 128, 128 and 40, the other five empty; every load scalar.
  check_route(testing::random_topk(37, 64, 8, 78, 3), 37, 64, 8, 200, 3);
#endif
}

TEST(CudaRoute, AllRoutesToOneExpert) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const int T = 5000, N = 64, K = 1;
  const std::vector<int32_t> topk(T, 63);  // the last expert takes everything
  for (int64_t capacity : {int64_t{T}, int64_t{2500}, int64_t{0}}) check_route(topk, T, N, K, capacity);
#endif
}

TEST(CudaRoute, ExpertIdsOutsideTheRangeAreDroppedOnTheGpu) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  // The CPU rejects such ids; the GPU cannot check on the host, so it counts them nowhere and
  // marks their routes dropped (moe/ops/cuda/route.h).
  const int T = 3, N = 4, K = 2;
  DeviceBuffer topk_d(DType::I32, {T, K}), counts_d(DType::I32, {N}), index_d(DType::I32, {T * K}),
      offsets_d(DType::I32, {N + 1});
  topk_d.upload_i32({1, 4, -3, 1, 0, 2});
  index_d.upload_i32(std::vector<int32_t>(T * K, kUnwritten));
  route_counts(counts_d, topk_d);
  route_index_local(index_d, offsets_d, topk_d, counts_d, 100);
  EXPECT_EQ(counts_d.download_i32(), (std::vector<int32_t>{1, 2, 1, 0}));
  EXPECT_EQ(index_d.download_i32(), (std::vector<int32_t>{1, -1, -1, 2, 0, 3}));
  EXPECT_EQ(offsets_d.download_i32(), (std::vector<int32_t>{0, 1, 3, 4, 4}));
#endif
}

TEST(CudaRoute, ExpertIdsOutsideTheRangeAtScale) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  // Ids outside [0, N) scattered through 4096 x 8 routes (every warp's segment), read with and
  // without 16-byte loads. Reference: the CPU's placement of the same selection with every such id
  // replaced by an extra expert N, whose rows come after every valid expert's and so move none of
  // them; on the GPU those routes are dropped (-1) and counted nowhere.
  const int T = 4096, N = 64, K = 8;
  std::vector<int32_t> topk = testing::random_topk(T, N, K, 91), as_extra = topk;
  const int32_t bad[] = {-1, N, INT32_MIN, INT32_MAX, -7, N + 5};
  for (size_t i = 13, b = 0; i < topk.size(); i += 97, ++b) {
    topk[i] = bad[b % 6];
    as_extra[i] = N;
  }
  for (int64_t capacity : {int64_t{T} * K, int64_t{T} * K * 3 / 4}) {
    const testing::CpuPlacement ref = testing::place_on_cpu(as_extra, T, N + 1, K, capacity);
    std::vector<int32_t> index_ref = ref.route_index;
    for (size_t i = 0; i < topk.size(); ++i)
      if (as_extra[i] == N) index_ref[i] = -1;
    const std::vector<int32_t> counts_ref(ref.counts.begin(), ref.counts.begin() + N),
        offsets_ref(ref.offsets.begin(), ref.offsets.begin() + N + 1);
    for (int lead : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "capacity=" << capacity << " lead=" << lead);
      DeviceBuffer topk_buffer(DType::I32, {lead + T * K}), counts_d(DType::I32, {N}), index_d(DType::I32, {T * K}),
          offsets_d(DType::I32, {N + 1});
      std::vector<int32_t> padded(static_cast<size_t>(lead), 0);
      padded.insert(padded.end(), topk.begin(), topk.end());
      topk_buffer.upload_i32(padded);
      const Tensor topk_d(static_cast<int32_t*>(topk_buffer.tensor().data) + lead, DType::I32, {T, K}, Device::CUDA);
      index_d.upload_i32(std::vector<int32_t>(T * K, kUnwritten));
      route_counts(counts_d, topk_d);
      route_index_local(index_d, offsets_d, topk_d, counts_d, capacity);
      EXPECT_EQ(counts_d.download_i32(), counts_ref);
      EXPECT_EQ(offsets_d.download_i32(), offsets_ref);
      EXPECT_EQ(index_d.download_i32(), index_ref);
    }
  }
#endif
}

// The device counts of three microbatches accumulated into a device load equal the CPU's exactly
// (N = 8, 128 and 70000, past one block of 256 experts); the load starts non-zero and keeps it.
TEST(CudaRoute, AccumulateCountsMatchesCpuExactly) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  for (int N : {8, 128, 70000}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N);
    const int T = 4096, K = 2;
    std::vector<float> load(N);
    for (int e = 0; e < N; ++e) load[e] = 0.25f * static_cast<float>(e % 7);
    DeviceBuffer load_d(DType::F32, {N}), counts_d(DType::I32, {N}), topk_d(DType::I32, {T, K});
    load_d.upload(load);
    for (uint64_t microbatch = 0; microbatch < 3; ++microbatch) {
      const std::vector<int32_t> topk = testing::random_topk(T, N, K, 500 + microbatch, N / 2);
      std::vector<int32_t> idx = topk, counts(N);
      route_counts(i32_tensor(counts.data(), {N}), i32_tensor(idx.data(), {T, K}));
      accumulate_counts(f32_tensor(load.data(), {N}), i32_tensor(counts.data(), {N}));
      topk_d.upload_i32(topk);
      route_counts(counts_d, topk_d);
      accumulate_counts(load_d, counts_d);  // device counts into the device load: no host read
    }
    const std::vector<float> got = load_d.download();
    EXPECT_EQ(std::memcmp(got.data(), load.data(), load.size() * sizeof(float)), 0) << "load differs from the CPU";
  }
  DeviceBuffer load_d(DType::F32, {4}), counts_d(DType::I32, {4}), counts_3(DType::I32, {3});
  std::vector<int32_t> counts_host(4);
  EXPECT_THROW(accumulate_counts(load_d, counts_3), Error);
  EXPECT_THROW(accumulate_counts(load_d, i32_tensor(counts_host.data(), {4})), Error);
  EXPECT_THROW(accumulate_counts(counts_d, counts_d), Error);
#endif
}

}  // namespace
}  // namespace moe

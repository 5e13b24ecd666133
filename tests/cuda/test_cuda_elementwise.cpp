// CUDA element-wise helpers against the CPU ops. Pure data movement (copy, fill_zero, cast_copy)
// must be exact. add_inplace is exact too: the CPU's FP32 sum rounded to BF16 is what the GPU
// computes. Outputs start poisoned; two runs give identical bits. accumulate_scalars must equal the
// CPU bit for bit, also when captured into a CUDA graph.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/rng.h"
#include "moe/ops/elementwise.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;
using testing::round_bf16;

std::vector<float> random_values(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
#endif

TEST(CudaElementwise, AddInplaceIsExact) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t n : {int64_t{1}, int64_t{100003}, int64_t{4096} * 1024}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " n " << n);
      auto y = random_values(n, 1 + n), x = random_values(n, 2 + n);
      if (dtype == DType::BF16) y = round_bf16(y), x = round_bf16(x);
      std::vector<float> ref = y;
      add_inplace(f32_tensor(ref.data(), {n}), f32_tensor(x.data(), {n}));
      if (dtype == DType::BF16) ref = round_bf16(ref);  // the FP32 sum, stored as BF16
      DeviceBuffer y_d(dtype, {n}), x_d(dtype, {n});
      y_d.upload(y);
      x_d.upload(x);
      add_inplace(y_d, x_d);
      EXPECT_TRUE(same_bits(y_d.download(), ref));
    }
  }
#endif
}

TEST(CudaElementwise, FillZeroAndCopyAreExactForEveryDtype) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  for (int64_t n : {int64_t{1}, int64_t{100003}}) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    for (DType dtype : {DType::F32, DType::BF16}) {
      auto src = random_values(n, 7 + n);
      if (dtype == DType::BF16) src = round_bf16(src);
      DeviceBuffer src_d(dtype, {n}), dst_d(dtype, {n});
      src_d.upload(src);
      copy(dst_d, src_d);
      EXPECT_TRUE(same_bits(dst_d.download(), src)) << dtype_name(dtype);
      fill_zero(dst_d);
      EXPECT_TRUE(same_bits(dst_d.download(), std::vector<float>(n, 0.0f))) << dtype_name(dtype);
    }
    std::vector<int32_t> ints(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ints[i] = static_cast<int32_t>(i * 7919 - 5);
    DeviceBuffer ints_d(DType::I32, {n}), ints_dst(DType::I32, {n});
    ints_d.upload_i32(ints);
    copy(ints_dst, ints_d);
    EXPECT_EQ(ints_dst.download_i32(), ints);
    fill_zero(ints_dst);
    EXPECT_EQ(ints_dst.download_i32(), std::vector<int32_t>(n, 0));
  }
#endif
}

// F32 -> BF16 bit-identical to moe::f32_to_bf16 (ties to even, NaN, infinities, overflow to inf,
// denormals), BF16 -> F32 exact, equal dtypes copy.
TEST(CudaElementwise, CastCopyMatchesHostRoundingBitForBit) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  std::vector<float> src = random_values(4096 * 1024 + 3, 11);
  const float specials[] = {0.0f, -0.0f, 1.0f + 0x1.0p-8f, 1.0f + 0x1.8p-7f, 0x1.fffffep127f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min() / 3,
                            -3.39e38f};
  src.insert(src.end(), std::begin(specials), std::end(specials));
  const int64_t n = static_cast<int64_t>(src.size());
  std::vector<uint16_t> want_bits(src.size());
  for (size_t i = 0; i < src.size(); ++i) want_bits[i] = f32_to_bf16(src[i]);
  std::vector<float> want(src.size());  // the BF16 values widened exactly, as download() reports them
  for (size_t i = 0; i < src.size(); ++i) want[i] = bf16_to_f32(want_bits[i]);

  // The host reference through the CPU op agrees with f32_to_bf16.
  std::vector<uint16_t> cpu_bits(src.size());
  cast_copy(Tensor(cpu_bits.data(), DType::BF16, {n}), f32_tensor(src.data(), {n}));
  EXPECT_EQ(cpu_bits, want_bits);

  DeviceBuffer f32_d(DType::F32, {n}), bf16_d(DType::BF16, {n}), back_d(DType::F32, {n}), bf16_copy(DType::BF16, {n});
  CUDA_CHECK(cudaMemcpy(f32_d.tensor().data, src.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  cast_copy(bf16_d, f32_d);
  EXPECT_TRUE(same_bits(bf16_d.download(), want)) << "F32 -> BF16";
  cast_copy(back_d, bf16_d);
  EXPECT_TRUE(same_bits(back_d.download(), want)) << "BF16 -> F32";
  cast_copy(bf16_copy, bf16_d);
  EXPECT_TRUE(same_bits(bf16_copy.download(), want)) << "BF16 -> BF16";
  DeviceBuffer f32_copy(DType::F32, {n});
  cast_copy(f32_copy, f32_d);
  EXPECT_TRUE(same_bits(f32_copy.download(), src)) << "F32 -> F32";

  DeviceBuffer wrong_shape(DType::BF16, {n + 1}), ints(DType::I32, {n});
  EXPECT_THROW(cast_copy(wrong_shape, f32_d), Error);
  EXPECT_THROW(cast_copy(ints, f32_d), Error);
#endif
}

#if defined(MOE_HAVE_CUDA)
// The same terms over host sources (for the CPU op) and device sources (for the GPU op): F32 and
// I32 sources, 150 random terms (three launches of 64), then a term whose source is stats itself.
struct ScalarTermsCase {
  std::vector<float> losses = random_values(10, 3), stats0 = {1.0f, 2.0f, 3.0f, 1e8f};
  std::vector<int32_t> counts = {7, 0, 123456789, -5, 16777217};  // 16777217 rounds when converted to F32
  DeviceBuffer losses_d{DType::F32, {2, 5}}, counts_d{DType::I32, {5}};

  ScalarTermsCase() {
    losses_d.upload(losses);
    counts_d.upload_i32(counts);
  }
  // Terms over stats (host or device) and this case's sources on stats' device.
  std::vector<ScalarTerm> terms(Tensor stats) {
    const bool on_gpu = stats.device == Device::CUDA;
    const Tensor loss_t = on_gpu ? losses_d.tensor() : f32_tensor(losses.data(), {2, 5});
    const Tensor count_t = on_gpu ? counts_d.tensor() : i32_tensor(counts.data(), {5});
    std::vector<ScalarTerm> t{{loss_t, 0, 0, 1.0f},
                              {loss_t, 9, 0, 0.1f},
                              {count_t, 2, 1, 0.5f},
                              {count_t, 4, 1, 1.0f},
                              {count_t, 3, 2, 3.0f}};
    Rng rng(4);
    for (int i = 0; i < 150; ++i)
      t.push_back({i % 3 == 0 ? count_t : loss_t, static_cast<int64_t>(rng.below(5)),
                   static_cast<int64_t>(rng.below(4)), static_cast<float>(rng.normal())});
    t.push_back({stats, 1, 3, -2.0f});  // reads a slot that earlier terms wrote
    return t;
  }
};
#endif

// Every term applied in order with FP32 rounding of the product and of the sum, bit-identical to the
// CPU (the random scales make a fused multiply-add show); no terms leave stats untouched.
TEST(CudaElementwise, AccumulateScalarsMatchesCpuBitForBit) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  ScalarTermsCase c;
  std::vector<float> want = c.stats0;
  accumulate_scalars(f32_tensor(want.data(), {4}), c.terms(f32_tensor(want.data(), {4})));
  DeviceBuffer stats_d(DType::F32, {4});
  stats_d.upload(c.stats0);
  accumulate_scalars(stats_d, c.terms(stats_d));
  const std::vector<float> got = stats_d.download();
  EXPECT_TRUE(same_bits(got, want)) << "stats " << got[0] << " " << got[1] << " " << got[2] << " " << got[3] << ", CPU "
                                    << want[0] << " " << want[1] << " " << want[2] << " " << want[3];
  accumulate_scalars(stats_d, {});
  EXPECT_TRUE(same_bits(stats_d.download(), got)) << "no terms changed stats";
#endif
}

// The op allocates nothing and reads nothing back on the host, so it can be captured into a CUDA
// graph (global capture mode refuses such calls); two replays add the terms twice.
TEST(CudaElementwise, AccumulateScalarsRunsInsideACapturedGraph) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  ScalarTermsCase c;
  std::vector<float> want = c.stats0;
  for (int replay = 0; replay < 2; ++replay)
    accumulate_scalars(f32_tensor(want.data(), {4}), c.terms(f32_tensor(want.data(), {4})));
  DeviceBuffer stats_d(DType::F32, {4});
  stats_d.upload(c.stats0);
  const std::vector<ScalarTerm> terms = c.terms(stats_d);
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  accumulate_scalars(stats_d, terms, Stream{s});
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaDeviceSynchronize());  // the uploads are done: s does not wait for the legacy stream
  for (int replay = 0; replay < 2; ++replay) CUDA_CHECK(cudaGraphLaunch(exec, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_TRUE(same_bits(stats_d.download(), want));
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(s));
#endif
}

TEST(CudaElementwise, AccumulateScalarsRejectsHostSourcesAndOutOfRangeTerms) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer stats_d(DType::F32, {3}), loss_d(DType::F32, {2}), half_d(DType::BF16, {2}), ints_d(DType::I32, {3});
  std::vector<float> loss_host(2);
  auto call = [&](Tensor src, int64_t index, int64_t slot) { accumulate_scalars(stats_d, {{src, index, slot, 1.0f}}); };
  EXPECT_THROW(call(f32_tensor(loss_host.data(), {2}), 0, 0), Error);  // a host source
  EXPECT_THROW(call(loss_d, 2, 0), Error);                             // index past src
  EXPECT_THROW(call(loss_d, 0, 3), Error);                             // slot past stats
  EXPECT_THROW(call(loss_d, 0, -1), Error);
  EXPECT_THROW(call(half_d, 0, 0), Error);              // BF16 source
  EXPECT_THROW(accumulate_scalars(ints_d, {}), Error);  // I32 stats
  EXPECT_NO_THROW(call(loss_d, 1, 2));
#endif
}

}  // namespace
}  // namespace moe

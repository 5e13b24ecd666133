// The element-wise helpers: residual add, zeroing, copies, the F32 <-> BF16 cast and the on-device
// scalar sums.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "moe/core/rng.h"
#include "moe/ops/elementwise.h"

namespace {

using moe::f32_tensor;
using moe::i32_tensor;

std::vector<float> random_values(int64_t n, uint64_t seed) {
  moe::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

TEST(Elementwise, AddInplaceFillZeroAndCopyAreExact) {
  const int64_t n = 100003;  // odd size above the parallel threshold
  auto y = random_values(n, 1), x = random_values(n, 2);
  const auto y0 = y;
  moe::add_inplace(f32_tensor(y.data(), {n}), f32_tensor(x.data(), {n}));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], y0[i] + x[i]);
  std::vector<float> dst(n, 7.0f);
  moe::copy(f32_tensor(dst.data(), {n}), f32_tensor(y.data(), {n}));
  EXPECT_EQ(dst, y);
  moe::fill_zero(f32_tensor(dst.data(), {n}));
  for (float v : dst) ASSERT_EQ(v, 0.0f);
  std::vector<int32_t> ints(5, 3), ints_src = {1, 2, 3, 4, 5};
  moe::copy(i32_tensor(ints.data(), {5}), i32_tensor(ints_src.data(), {5}));
  EXPECT_EQ(ints, ints_src);
  moe::fill_zero(i32_tensor(ints.data(), {5}));
  for (int32_t v : ints) EXPECT_EQ(v, 0);
}

// F32 -> BF16 rounds to nearest even exactly as moe::f32_to_bf16 (ties, NaN, infinities, values
// that round up into the next binade, denormals); BF16 -> F32 is exact; equal dtypes copy.
TEST(Elementwise, CastCopyRoundsToNearestEvenAndWidensExactly) {
  std::vector<float> src = random_values(1001, 5);
  const float specials[] = {0.0f, -0.0f, 1.0f + 0x1.0p-8f /* tie: stays 1 */,
                            1.0f + 0x1.8p-7f /* tie: rounds up to even */, 1.0f + 0x1.0p-9f,
                            0x1.fffffep127f /* rounds to inf */, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min() / 3, -3.39e38f};
  src.insert(src.end(), std::begin(specials), std::end(specials));
  const int64_t n = static_cast<int64_t>(src.size());
  std::vector<uint16_t> half(n, 0xdead);
  moe::cast_copy(moe::Tensor(half.data(), moe::DType::BF16, {n}), f32_tensor(src.data(), {n}));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(half[i], moe::f32_to_bf16(src[i])) << "at " << i << " value " << src[i];
  EXPECT_EQ(half[n - 13 + 2], 0x3f80);  // the tie 1 + 2^-8 keeps the even mantissa of 1
  EXPECT_EQ(half[n - 13 + 3], 0x3f82);  // the tie 1 + 3 * 2^-8 rounds up to the even 1 + 2^-6

  std::vector<float> wide(n, 7.0f);
  moe::cast_copy(f32_tensor(wide.data(), {n}), moe::Tensor(half.data(), moe::DType::BF16, {n}));
  for (int64_t i = 0; i < n; ++i) {
    const float want = moe::bf16_to_f32(half[i]);
    ASSERT_EQ(std::memcmp(&wide[i], &want, 4), 0) << "at " << i;
  }

  std::vector<float> same(n, 7.0f);
  moe::cast_copy(f32_tensor(same.data(), {n}), f32_tensor(src.data(), {n}));
  EXPECT_EQ(std::memcmp(same.data(), src.data(), n * sizeof(float)), 0);
  std::vector<uint16_t> half_copy(n, 0);
  moe::cast_copy(moe::Tensor(half_copy.data(), moe::DType::BF16, {n}), moe::Tensor(half.data(), moe::DType::BF16, {n}));
  EXPECT_EQ(half_copy, half);
}

TEST(Elementwise, CastCopyRejectsShapeMismatchAndOtherDtypes) {
  std::vector<float> a(6);
  std::vector<uint16_t> h(6);
  std::vector<int32_t> ints(6);
  EXPECT_THROW(moe::cast_copy(moe::Tensor(h.data(), moe::DType::BF16, {2, 3}), f32_tensor(a.data(), {3, 2})),
               moe::Error);
  EXPECT_THROW(moe::cast_copy(f32_tensor(a.data(), {6}), i32_tensor(ints.data(), {6})), moe::Error);
}

TEST(Elementwise, HelpersRejectMismatchedShapesOrDtypes) {
  std::vector<float> a(6), b(6);
  EXPECT_THROW(moe::add_inplace(f32_tensor(a.data(), {2, 3}), f32_tensor(b.data(), {3, 2})), moe::Error);
  EXPECT_THROW(moe::copy(f32_tensor(a.data(), {6}), moe::Tensor(b.data(), moe::DType::I32, {6})), moe::Error);
}

// The naive loop of accumulate_scalars, one FP32 product and one FP32 sum per term, in order.
void ref_accumulate(std::vector<float>& stats, const std::vector<moe::ScalarTerm>& terms) {
  for (const auto& term : terms) {
    const float value =
        term.src.dtype == moe::DType::I32 ? static_cast<float>(term.src.i32()[term.index]) : term.src.f32()[term.index];
    const float product = term.scale * value;
    stats[term.slot] = stats[term.slot] + product;
  }
}

// F32 and I32 sources, several terms into one slot (order matters in FP32), a source that is stats
// itself, and 150 terms (more than one CUDA launch's worth): bit-identical to the naive loop.
TEST(Elementwise, AccumulateScalarsAddsTermsInOrderExactly) {
  auto losses = random_values(10, 3);
  std::vector<int32_t> counts = {7, 0, 123456789, -5, 16777217};  // 16777217 rounds when converted to F32
  std::vector<float> stats = {1.0f, 2.0f, 3.0f, 1e8f}, want = stats;
  const moe::Tensor loss_t = f32_tensor(losses.data(), {2, 5}), count_t = i32_tensor(counts.data(), {5});
  const moe::Tensor stats_t = f32_tensor(stats.data(), {4});
  std::vector<moe::ScalarTerm> terms{
      {loss_t, 0, 0, 1.0f}, {loss_t, 9, 0, 0.1f}, {count_t, 2, 1, 0.5f}, {count_t, 4, 1, 1.0f}, {count_t, 3, 2, 3.0f}};
  moe::Rng rng(4);
  for (int i = 0; i < 150; ++i)
    terms.push_back({i % 3 == 0 ? count_t : loss_t, static_cast<int64_t>(rng.below(5)),
                     static_cast<int64_t>(rng.below(4)), static_cast<float>(rng.normal())});
  terms.push_back({stats_t, 1, 3, -2.0f});  // reads a slot that earlier terms wrote
  auto want_terms = terms;
  want_terms.back().src = f32_tensor(want.data(), {4});
  moe::accumulate_scalars(stats_t, terms);
  ref_accumulate(want, want_terms);
  EXPECT_EQ(std::memcmp(stats.data(), want.data(), stats.size() * sizeof(float)), 0);
  EXPECT_EQ(counts, (std::vector<int32_t>{7, 0, 123456789, -5, 16777217})) << "a source was modified";

  const auto before = stats;
  moe::accumulate_scalars(stats_t, {});  // no terms: nothing happens
  EXPECT_EQ(std::memcmp(stats.data(), before.data(), stats.size() * sizeof(float)), 0);
}

TEST(Elementwise, AccumulateScalarsRejectsOutOfRangeTermsAndOtherDtypes) {
  std::vector<float> stats(3, 0.0f), loss(2, 1.0f);
  std::vector<uint16_t> half(2);
  const moe::Tensor stats_t = f32_tensor(stats.data(), {3}), loss_t = f32_tensor(loss.data(), {2});
  auto call = [&](moe::Tensor src, int64_t index, int64_t slot) {
    moe::accumulate_scalars(stats_t, {{loss_t, 0, 0, 1.0f}, {src, index, slot, 1.0f}});
  };
  EXPECT_THROW(call(loss_t, 2, 0), moe::Error);   // index past src
  EXPECT_THROW(call(loss_t, -1, 0), moe::Error);  // negative index
  EXPECT_THROW(call(loss_t, 0, 3), moe::Error);   // slot past stats
  EXPECT_THROW(call(loss_t, 0, -1), moe::Error);  // negative slot
  EXPECT_THROW(call(moe::Tensor(half.data(), moe::DType::BF16, {2}), 0, 0), moe::Error);
  EXPECT_THROW(call(moe::Tensor(), 0, 0), moe::Error);  // no data
  EXPECT_EQ(stats, std::vector<float>(3, 0.0f)) << "a rejected call changed stats";
  EXPECT_THROW(moe::accumulate_scalars(i32_tensor(reinterpret_cast<int32_t*>(stats.data()), {3}), {}), moe::Error);
  EXPECT_NO_THROW(call(loss_t, 1, 2));
  EXPECT_EQ(stats, (std::vector<float>{1.0f, 0.0f, 1.0f}));
}

}  // namespace

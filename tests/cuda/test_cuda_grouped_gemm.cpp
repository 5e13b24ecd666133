// cuda::grouped_matmul / grouped_matmul_wgrad against the CPU ops on fresh random inputs, with the
// per-expert offsets only on the device: E in {1, 8, 64}, experts with zero rows, rows before
// offsets[0] and past offsets[E] untouched (poisoned c stays NaN; NaN a rows there are never read),
// trans_b both ways, accumulate, BF16 inputs with BF16 or F32 output.
// Tolerances (normalized error over the rows the op writes): F32 <= 1e-5; BF16 inputs (rounded to
// BF16 before the CPU reference) <= 1e-2. Untouched rows and zero-row experts must be bit-exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "cuda_test_util.h"
#include "moe/ops/grouped_gemm.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
constexpr double kTolF32 = 1e-5;
constexpr double kTolBf16 = 1e-2;

std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

bool same_bits(float x, float y) { return std::memcmp(&x, &y, sizeof(float)) == 0; }

struct Layout {
  std::vector<int32_t> offsets;  // [E+1]
  int64_t rows = 0;              // buffer rows (capacity), > offsets[E]
};

// counts per expert, `lead` unused rows before expert 0 and `tail` after the last expert.
Layout make_layout(const std::vector<int32_t>& counts, int32_t lead, int32_t tail) {
  Layout l;
  l.offsets.push_back(lead);
  for (int32_t c : counts) l.offsets.push_back(l.offsets.back() + c);
  l.rows = l.offsets.back() + tail;
  return l;
}

std::vector<int32_t> random_counts(int E, int max_count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, max_count);
  std::vector<int32_t> counts(E);
  for (int e = 0; e < E; ++e) counts[e] = (e % 5 == 2) ? 0 : dist(rng);  // every fifth expert empty
  return counts;
}

// Random values in rows [o_0, o_E) of a [rows, cols] buffer, NaN elsewhere (must never be read).
std::vector<float> routed_rows(const Layout& l, int64_t cols, uint32_t seed, bool bf16) {
  std::vector<float> v = random_values(l.rows * cols, seed);
  if (bf16) v = testing::round_bf16(v);
  const int64_t first = l.offsets.front(), last = l.offsets.back();
  for (int64_t r = 0; r < l.rows; ++r)
    if (r < first || r >= last)
      for (int64_t j = 0; j < cols; ++j) v[r * cols + j] = NAN;
  return v;
}

using testing::DeviceBuffer;

void expect_grouped_matmul_matches_cpu(const Layout& l, int64_t k_in, int64_t n_out, bool trans_b, bool accumulate,
                                       DType in, DType out, uint32_t seed) {
  const int64_t E = static_cast<int64_t>(l.offsets.size()) - 1;
  std::ostringstream what;
  what << "E=" << E << " rows=" << l.rows << " k_in=" << k_in << " n_out=" << n_out << " trans_b=" << trans_b
       << " accumulate=" << accumulate << " in=" << dtype_name(in) << " out=" << dtype_name(out);
  const bool bf16_in = in == DType::BF16;
  const std::vector<float> a = routed_rows(l, k_in, seed, bf16_in);
  std::vector<float> b = random_values(E * n_out * k_in, seed + 1);
  if (bf16_in) b = testing::round_bf16(b);
  std::vector<float> c0 = random_values(l.rows * n_out, seed + 2);
  if (out == DType::BF16) c0 = testing::round_bf16(c0);
  const Shape b_shape = trans_b ? Shape{E, n_out, k_in} : Shape{E, k_in, n_out};

  std::vector<float> ref = c0;
  std::vector<int32_t> offsets = l.offsets;
  grouped_matmul(f32_tensor(ref.data(), {l.rows, n_out}), f32_tensor(const_cast<float*>(a.data()), {l.rows, k_in}),
                 f32_tensor(b.data(), b_shape), i32_tensor(offsets.data(), {E + 1}), trans_b, accumulate);

  DeviceBuffer da(in, {l.rows, k_in}), db(in, b_shape), dc(out, {l.rows, n_out}), doff(DType::I32, {E + 1});
  da.upload(a);
  db.upload(b);
  doff.upload_i32(l.offsets);
  if (accumulate) dc.upload(c0);  // otherwise c stays poisoned (NaN)
  grouped_matmul(dc, da, db, doff, trans_b, accumulate);
  const std::vector<float> got = dc.download();

  std::vector<float> got_in, ref_in;
  const int64_t first = l.offsets.front(), last = l.offsets.back();
  for (int64_t r = 0; r < l.rows; ++r) {
    for (int64_t j = 0; j < n_out; ++j) {
      const size_t i = static_cast<size_t>(r * n_out + j);
      if (r >= first && r < last) {
        got_in.push_back(got[i]);
        ref_in.push_back(ref[i]);
      } else if (accumulate) {
        ASSERT_TRUE(same_bits(got[i], c0[i])) << what.str() << ": row " << r << " outside the experts was written";
      } else {
        ASSERT_TRUE(std::isnan(got[i])) << what.str() << ": row " << r << " outside the experts was written";
      }
    }
  }
  EXPECT_LE(testing::normalized_error(got_in, ref_in), bf16_in ? kTolBf16 : kTolF32) << what.str();
}

void expect_wgrad_matches_cpu(const Layout& l, int64_t k_in, int64_t n_out, DType in, DType out, uint32_t seed) {
  const int64_t E = static_cast<int64_t>(l.offsets.size()) - 1;
  std::ostringstream what;
  what << "wgrad E=" << E << " rows=" << l.rows << " k_in=" << k_in << " n_out=" << n_out << " in=" << dtype_name(in)
       << " out=" << dtype_name(out);
  const bool bf16_in = in == DType::BF16;
  const std::vector<float> dc = routed_rows(l, n_out, seed, bf16_in);
  const std::vector<float> a = routed_rows(l, k_in, seed + 1, bf16_in);
  std::vector<float> db0 = random_values(E * n_out * k_in, seed + 2);
  if (out == DType::BF16) db0 = testing::round_bf16(db0);

  std::vector<float> ref = db0;
  std::vector<int32_t> offsets = l.offsets;
  grouped_matmul_wgrad(f32_tensor(ref.data(), {E, n_out, k_in}),
                       f32_tensor(const_cast<float*>(dc.data()), {l.rows, n_out}),
                       f32_tensor(const_cast<float*>(a.data()), {l.rows, k_in}), i32_tensor(offsets.data(), {E + 1}));

  DeviceBuffer ddb(out, {E, n_out, k_in}), ddc(in, {l.rows, n_out}), da(in, {l.rows, k_in}), doff(DType::I32, {E + 1});
  ddb.upload(db0);
  ddc.upload(dc);
  da.upload(a);
  doff.upload_i32(l.offsets);
  grouped_matmul_wgrad(ddb, ddc, da, doff);
  const std::vector<float> got = ddb.download();
  for (int64_t e = 0; e < E; ++e) {
    if (l.offsets[e] != l.offsets[e + 1]) continue;
    for (int64_t i = e * n_out * k_in; i < (e + 1) * n_out * k_in; ++i)
      ASSERT_TRUE(same_bits(got[i], db0[i])) << what.str() << ": expert " << e << " has no rows but db changed";
  }
  EXPECT_LE(testing::normalized_error(got, ref), bf16_in ? kTolBf16 : kTolF32) << what.str();
}

struct DtypePair {
  DType in, out;
};
const DtypePair kDtypes[] = {{DType::F32, DType::F32}, {DType::BF16, DType::BF16}, {DType::BF16, DType::F32}};

std::vector<Layout> layouts() {
  return {
      make_layout({200}, 0, 0),                          // E = 1, full buffer
      make_layout({1}, 3, 5),                            // E = 1, one row between unused rows
      make_layout(random_counts(8, 150, 1), 5, 70),      // E = 8, tiles straddle experts
      make_layout({0, 0, 0, 333, 0, 0, 0, 0}, 0, 64),    // all rows in one expert
      make_layout(random_counts(64, 40, 2), 17, 9),      // E = 64, many small and empty experts
      make_layout(std::vector<int32_t>(64, 0), 0, 128),  // E = 64, no rows at all
  };
}
#endif

TEST(CudaGroupedGemm, ForwardMatchesCpuForEveryLayoutAndDtype) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  uint32_t seed = 1000;
  for (const Layout& l : layouts())
    for (const DtypePair& d : kDtypes)
      for (bool trans_b : {false, true})
        for (bool accumulate : {false, true})
          expect_grouped_matmul_matches_cpu(l, 67, 45, trans_b, accumulate, d.in, d.out, seed += 3);
#endif
}

TEST(CudaGroupedGemm, ForwardMatchesCpuAtModelSizes) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const Layout l = make_layout(random_counts(8, 600, 3), 0, 100);
  uint32_t seed = 2000;
  for (const DtypePair& d : kDtypes)
    for (bool trans_b : {false, true})
      expect_grouped_matmul_matches_cpu(l, 512, 256, trans_b, false, d.in, d.out, seed += 3);
#endif
}

TEST(CudaGroupedGemm, WgradMatchesCpuForEveryLayoutAndDtype) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  uint32_t seed = 3000;
  for (const Layout& l : layouts())
    for (const DtypePair& d : kDtypes) expect_wgrad_matches_cpu(l, 67, 45, d.in, d.out, seed += 3);
  const Layout big = make_layout(random_counts(8, 600, 4), 0, 100);
  for (const DtypePair& d : kDtypes) expect_wgrad_matches_cpu(big, 512, 256, d.in, d.out, seed += 3);
#endif
}

TEST(CudaGroupedGemm, WgradIsDeterministic) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const Layout l = make_layout(random_counts(8, 300, 5), 0, 0);
  const int64_t E = 8, n_out = 96, k_in = 80;
  DeviceBuffer dc(DType::BF16, {l.rows, n_out}), a(DType::BF16, {l.rows, k_in}), off(DType::I32, {E + 1});
  DeviceBuffer db1(DType::F32, {E, n_out, k_in}), db2(DType::F32, {E, n_out, k_in});
  dc.upload(random_values(l.rows * n_out, 6));
  a.upload(random_values(l.rows * k_in, 7));
  off.upload_i32(l.offsets);
  const std::vector<float> zeros(static_cast<size_t>(E * n_out * k_in), 0.0f);
  db1.upload(zeros);
  db2.upload(zeros);
  grouped_matmul_wgrad(db1, dc, a, off);
  grouped_matmul_wgrad(db2, dc, a, off);
  EXPECT_EQ(db1.download(), db2.download());
#endif
}

TEST(CudaGroupedGemm, MismatchedDtypesAreRefused) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer a(DType::F32, {4, 8}), b(DType::BF16, {2, 8, 6}), c(DType::F32, {4, 6}), off(DType::I32, {3});
  EXPECT_THROW(grouped_matmul(c, a, b, off, false, false), Error);
  DeviceBuffer b32(DType::F32, {2, 8, 6}), c16(DType::BF16, {4, 6});
  EXPECT_THROW(grouped_matmul(c16, a, b32, off, false, false), Error);
  DeviceBuffer off_bad(DType::I32, {2});
  EXPECT_THROW(grouped_matmul(c, a, b32, off_bad, false, false), Error);
#endif
}

}  // namespace
}  // namespace moe

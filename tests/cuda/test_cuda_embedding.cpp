// CUDA embedding lookup/accumulation against the CPU ops. embedding_forward is pure data movement
// and must be exact; embedding_backward is exact as well: each dtable element gets the same FP32
// additions in the same row order as on the CPU (BF16 dout is widened exactly). Outputs start
// poisoned; two runs give identical bits.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/rng.h"
#include "moe/ops/elementwise.h"
#include "moe/ops/embedding.h"

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

std::vector<int32_t> random_tokens(int64_t n, int64_t V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng.below(V));
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// R, V, D: one row, odd sizes, heavy repetition (V << R) spanning several column chunks, many
// partitions with a vocab of 50304, and a large table. D a multiple of 8 takes the 16-byte path
// (D = 8, 24, 2048), other D the scalar path (D = 3, 300, 1030); R = 300 and 1000 are not
// multiples of the 128 token ids of a scan step.
const int64_t kShapes[][3] = {{1, 1, 1},      {5, 7, 3},         {40, 11, 300},      {300, 13, 8},
                              {1000, 5, 24},  {777, 3, 1030},    {4096, 50, 1024},   {2048, 50304, 512},
                              {2000, 4099, 2048}};

void check_embedding_forward(DType dtype) {
  uint64_t seed = 1;
  for (const auto& s : kShapes) {
    const int64_t R = s[0], V = s[1], D = s[2];
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " R " << R << " V " << V << " D " << D);
    auto table = random_values(V * D, seed++);
    if (dtype == DType::BF16) table = round_bf16(table);
    const auto tokens = random_tokens(R, V, seed++);
    std::vector<float> ref(R * D);
    auto tokens_host = tokens;
    embedding_forward(f32_tensor(ref.data(), {R, D}), f32_tensor(table.data(), {V, D}),
                      i32_tensor(tokens_host.data(), {R}));

    DeviceBuffer table_d(dtype, {V, D}), tokens_d(DType::I32, {R}), out_d(dtype, {R, D});
    table_d.upload(table);
    tokens_d.upload_i32(tokens);
    embedding_forward(out_d, table_d, tokens_d);
    EXPECT_TRUE(same_bits(out_d.download(), ref)) << "embedding_forward is not an exact copy of table rows";
  }
}

void check_embedding_backward(DType dtype) {
  uint64_t seed = 100;
  for (const auto& s : kShapes) {
    const int64_t R = s[0], V = s[1], D = s[2];
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " R " << R << " V " << V << " D " << D);
    auto dout = random_values(R * D, seed++);
    if (dtype == DType::BF16) dout = round_bf16(dout);
    const auto tokens = random_tokens(R, V, seed++);
    const auto dtable0 = random_values(V * D, seed++);  // existing gradient: accumulated into
    auto ref = dtable0;
    auto tokens_host = tokens;
    embedding_backward(f32_tensor(ref.data(), {V, D}), f32_tensor(dout.data(), {R, D}),
                       i32_tensor(tokens_host.data(), {R}));

    DeviceBuffer dtable_d(DType::F32, {V, D}), tokens_d(DType::I32, {R}), dout_d(dtype, {R, D});
    dout_d.upload(dout);
    tokens_d.upload_i32(tokens);
    auto run = [&] {
      dtable_d.upload(dtable0);
      embedding_backward(dtable_d, dout_d, tokens_d);
      return dtable_d.download();
    };
    const auto got = run();
    EXPECT_LE(testing::normalized_error(got, ref), 1e-6);  // a readable figure should the exact check fail
    EXPECT_TRUE(same_bits(got, ref)) << "embedding_backward differs from the CPU's ordered FP32 sums";
    EXPECT_TRUE(same_bits(run(), got)) << "embedding_backward is not deterministic";
  }
}
#endif

TEST(CudaEmbedding, ForwardCopiesTableRowsExactlyF32) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  check_embedding_forward(DType::F32);
#endif
}

TEST(CudaEmbedding, ForwardCopiesTableRowsExactlyBF16) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  check_embedding_forward(DType::BF16);
#endif
}

TEST(CudaEmbedding, BackwardAccumulatesRepeatedTokensExactlyAndDeterministicallyF32) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  check_embedding_backward(DType::F32);
#endif
}

TEST(CudaEmbedding, BackwardAccumulatesRepeatedTokensExactlyAndDeterministicallyBF16) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  check_embedding_backward(DType::BF16);
#endif
}

TEST(CudaEmbedding, RejectsMixedDtypesAndAHalfPrecisionAccumulator) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer table_bf16(DType::BF16, {7, 4}), out_f32(DType::F32, {3, 4}), tokens(DType::I32, {3}),
      dout(DType::F32, {3, 4}), y(DType::BF16, {5}), x(DType::F32, {5});
  EXPECT_THROW(embedding_forward(out_f32, table_bf16, tokens), Error);
  EXPECT_THROW(embedding_backward(table_bf16, dout, tokens), Error);
  EXPECT_THROW(add_inplace(y, x), Error);
#endif
}

}  // namespace
}  // namespace moe

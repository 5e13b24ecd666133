// CPU embedding lookup and accumulation.
#include "moe/ops/cpu/embedding.h"

#include <cstring>

namespace moe::cpu {
namespace {

// Columns per task in embedding_backward.
constexpr int64_t kColumnBlock = 256;

}  // namespace

void embedding_forward(Tensor out, Tensor table, Tensor tokens, Stream /*stream*/) {
  const int64_t R = out.dim(0), D = out.dim(1);
  const int32_t* tok = tokens.i32();
  const float* tp = table.f32();
  float* op_ = out.f32();
#pragma omp parallel for schedule(static) if (R * D > (1 << 15))
  for (int64_t r = 0; r < R; ++r) std::memcpy(op_ + r * D, tp + tok[r] * D, static_cast<size_t>(D) * sizeof(float));
}

// Each task owns a block of columns and walks the rows in order, so repeated tokens add up
// without races and the result is the same for any thread count.
void embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Stream /*stream*/) {
  const int64_t R = dout.dim(0), D = dout.dim(1);
  const int32_t* tok = tokens.i32();
  const float* gp = dout.f32();
  float* dtp = dtable.f32();
  const int64_t n_blocks = (D + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (R * D > (1 << 15))
  for (int64_t blk = 0; blk < n_blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock;
    const int64_t c1 = c0 + kColumnBlock < D ? c0 + kColumnBlock : D;
    for (int64_t r = 0; r < R; ++r) {
      const float* g = gp + r * D;
      float* dt = dtp + static_cast<int64_t>(tok[r]) * D;
      for (int64_t c = c0; c < c1; ++c) dt[c] += g[c];
    }
  }
}

}  // namespace moe::cpu

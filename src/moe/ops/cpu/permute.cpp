// CPU row movement. Tokens are independent, so loops run over tokens under OpenMP. Each loop
// that writes expert-buffer rows relies on route_index being injective (ops/permute.cpp checks it),
// so no two threads write the same row. Sums over k run in ascending k order in FP32.
#include "moe/ops/cpu/permute.h"

#include <algorithm>
#include <cstring>

namespace moe::cpu {

namespace {

// Columns handled per pass when summing over k, so the partial sums stay in registers/L1.
constexpr int64_t kColumnChunk = 256;

// Below this many elements of work a loop runs on the calling thread: waking the OpenMP team
// costs more than the loop.
constexpr int64_t kMinParallelWork = 1 << 15;

// out[t] (= or +=) sum over kept k, in k order, of rows[route_index[t*K+k]], each times
// weights[t, k] when kWeighted: the combine, and without weights the scatter's gradient.
template <bool kWeighted>
void sum_routes(Tensor out, Tensor rows, const float* weights, Tensor route_index, int top_k, bool accumulate) {
  const int64_t T = out.dim(0), D = out.dim(1);
  const float* rv = rows.f32();
  float* o = out.f32();
  const int32_t* index = route_index.i32();
#pragma omp parallel for schedule(static) if (T * top_k * D >= kMinParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    float acc[kColumnChunk];
    float* out_row = o + t * D;
    for (int64_t c0 = 0; c0 < D; c0 += kColumnChunk) {
      const int64_t n = std::min(kColumnChunk, D - c0);
      std::fill(acc, acc + n, 0.0f);
      for (int k = 0; k < top_k; ++k) {
        const int32_t r = index[t * top_k + k];
        if (r < 0) continue;  // a dropped route contributes zero
        const float* row = rv + static_cast<int64_t>(r) * D + c0;
        if constexpr (kWeighted) {
          const float wk = weights[t * top_k + k];
          for (int64_t j = 0; j < n; ++j) acc[j] += wk * row[j];
        } else {
          for (int64_t j = 0; j < n; ++j) acc[j] += row[j];
        }
      }
      if (accumulate)
        for (int64_t j = 0; j < n; ++j) out_row[c0 + j] += acc[j];
      else
        std::copy(acc, acc + n, out_row + c0);
    }
  }
}

}  // namespace

// Pure data movement: any element type, copied bytewise.
void scatter_rows_to_routes(Tensor dst, Tensor src, Tensor route_index, int top_k, Stream /*stream*/) {
  const int64_t T = src.dim(0), D = src.dim(1);
  const size_t row_bytes = static_cast<size_t>(D) * dtype_size(src.dtype);
  const char* s = static_cast<const char*>(src.data);
  char* d = static_cast<char*>(dst.data);
  const int32_t* index = route_index.i32();
#pragma omp parallel for schedule(static) if (T * top_k * D >= kMinParallelWork)
  for (int64_t t = 0; t < T; ++t)
    for (int k = 0; k < top_k; ++k) {
      const int32_t r = index[t * top_k + k];
      if (r >= 0)
        std::memcpy(d + static_cast<size_t>(r) * row_bytes, s + static_cast<size_t>(t) * row_bytes, row_bytes);
    }
}

void scatter_rows_to_routes_backward(Tensor dsrc, Tensor ddst, Tensor route_index, int top_k, bool accumulate,
                                     Stream /*stream*/) {
  sum_routes</*kWeighted=*/false>(dsrc, ddst, nullptr, route_index, top_k, accumulate);
}

void combine_rows(Tensor out, Tensor y, Tensor weights, Tensor route_index, int top_k, bool accumulate,
                  Stream /*stream*/) {
  sum_routes</*kWeighted=*/true>(out, y, weights.f32(), route_index, top_k, accumulate);
}

void combine_rows_backward(Tensor dy, Tensor dweights, Tensor dout, Tensor y, Tensor weights, Tensor route_index,
                           int top_k, Stream /*stream*/) {
  const int64_t T = dout.dim(0), D = dout.dim(1);
  const float* yv = y.f32();
  const float* w = weights.f32();
  const float* go = dout.f32();
  float* gy = dy.f32();
  float* gw = dweights.f32();
  const int32_t* index = route_index.i32();
#pragma omp parallel for schedule(static) if (T * top_k * D >= kMinParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = go + t * D;
    for (int k = 0; k < top_k; ++k) {
      const int64_t i = t * top_k + k;
      const int32_t r = index[i];
      if (r < 0) {
        gw[i] = 0.0f;
        continue;
      }
      const float wk = w[i];
      const float* row = yv + static_cast<int64_t>(r) * D;
      float* grow = gy + static_cast<int64_t>(r) * D;
      float dot = 0.0f;
      for (int64_t j = 0; j < D; ++j) {
        dot += g[j] * row[j];
        grow[j] = wk * g[j];
      }
      gw[i] = dot;
    }
  }
}

}  // namespace moe::cpu

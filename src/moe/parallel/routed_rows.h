// The arithmetic shared by the multi-rank dispatchers. Each backend finds the row of route
// (t, k) its own way (a peer's symmetric buffer, or a receive buffer of an all-to-all) and hands
// it here as a pointer (nullptr = dropped route), so rowwise and alltoall compute bit-identical
// results: same FP32 operations in the same order, the order of ops/cpu/permute.cpp (column
// chunks, k ascending), so EP = 1 also matches the local dispatcher.
#pragma once

#include <algorithm>
#include <cstdint>

namespace moe::routed {

constexpr int64_t kColumnChunk = 256;
// Below this many elements of work a loop runs on the calling thread.
constexpr int64_t kMinParallelWork = 1 << 15;

// out[t] (+= or =) sum over kept k, ascending, of (weights ? weights[t,k] : 1) * row_of(t*K + k).
// out [T, D]; weights [T, K] or nullptr (plain sum, the gradient of dispatch).
template <typename RowOf>
void sum_routes(float* out, const float* weights, int64_t tokens, int top_k, int64_t hidden, bool accumulate,
                RowOf row_of) {
  const int64_t D = hidden;
#pragma omp parallel for schedule(static) if (tokens * top_k * D >= kMinParallelWork)
  for (int64_t t = 0; t < tokens; ++t) {
    float acc[kColumnChunk];
    float* out_row = out + t * D;
    for (int64_t c0 = 0; c0 < D; c0 += kColumnChunk) {
      const int64_t n = std::min(kColumnChunk, D - c0);
      std::fill(acc, acc + n, 0.0f);
      for (int k = 0; k < top_k; ++k) {
        const float* row = row_of(t * top_k + k);
        if (row == nullptr) continue;  // a dropped route contributes zero
        row += c0;
        if (weights != nullptr) {
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

// dot(a, b) over D elements, FP32, ascending (the combine-weight gradient).
inline float dot_row(const float* a, const float* b, int64_t hidden) {
  float dot = 0.0f;
  for (int64_t j = 0; j < hidden; ++j) dot += a[j] * b[j];
  return dot;
}

// dst = w * src over D elements (the weighted output-gradient row).
inline void scale_row(float* dst, float w, const float* src, int64_t hidden) {
  for (int64_t j = 0; j < hidden; ++j) dst[j] = w * src[j];
}

}  // namespace moe::routed

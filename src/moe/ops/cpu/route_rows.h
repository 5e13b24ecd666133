// CPU loops over a token's K routed rows, shared by the local ops (ops/cpu/permute.cpp) and the
// multi-rank CPU dispatchers (parallel/rowwise_dispatcher.cpp, parallel/alltoall_dispatcher.cpp),
// which differ only in where the row of route i = t*K + k lives: a row_of functor maps i to a
// pointer to that row, or nullptr for a dropped route (ops: a local buffer; rowwise: a peer's
// symmetric buffer; alltoall: a receive buffer of an all-to-all). The CPU mirror of
// ops/cuda/route_rows.cuh:
//
//   scatter_routes:          row_of(t*K+k) = x[t] for every kept route: the gather into
//                            expert-major rows and the dispatch;
//   scatter_routes_fp8:      the same with x[t] quantized once into FP8 codes and scales
//                            (ep.payload = "fp8"): codes_of / scales_of give the route's rows;
//   sum_routes:              out[t] (+= or =) sum over kept k of w[t,k] * row_of(t*K+k): the
//                            weighted combine and the gather / dispatch backward;
//   combine_backward_routes: dy_of(i) = w[i] * dout[t] and dweights[i] = dot(dout[t], y_of(i))
//                            for kept routes, dweights[i] = 0 for dropped ones; a null dy_of(i)
//                            row is not written (weights may then be null).
//
// Every backend runs the same FP32 operations in the same order (column chunks, k ascending), so
// rowwise, alltoall and the local dispatcher compute bit-identical results. Tokens are independent,
// so loops run over tokens under OpenMP; loops that write routed rows rely on each kept route
// having a row of its own (ops/permute.cpp checks route_index is injective), so no two threads
// write the same row.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "moe/ops/cpu/fp8.h"

namespace moe::cpu::route_rows {

// Columns handled per pass when summing over k, so the partial sums stay in registers/L1.
constexpr int64_t kColumnChunk = 256;
// Below this many elements of work a loop runs on the calling thread: waking the OpenMP team
// costs more than the loop.
constexpr int64_t kMinParallelWork = 1 << 15;

// Copies token row t (row_bytes bytes of x) to row_of(t*K + k) for every kept k. Pure data
// movement: any element type. `hidden` (elements per row) only sizes the work for OpenMP.
template <typename RowOf>
void scatter_routes(const void* x, size_t row_bytes, int64_t tokens, int top_k, int64_t hidden, RowOf row_of) {
  const char* src = static_cast<const char*>(x);
#pragma omp parallel for schedule(static) if (tokens * top_k * hidden >= kMinParallelWork)
  for (int64_t t = 0; t < tokens; ++t)
    for (int k = 0; k < top_k; ++k)
      if (void* row = row_of(t * top_k + k); row != nullptr)
        std::memcpy(row, src + static_cast<size_t>(t) * row_bytes, row_bytes);
}

// Quantizes token row t of x (F32, `hidden` elements) once into 1 x 128 tiles (fp8_quantize_rows'
// bits) and copies its codes (hidden bytes) to codes_of(t*K + k) and its ceil(hidden / 128) scales
// to scales_of(t*K + k) for every kept k (both nullptr for a dropped route). A token without a kept
// route is not quantized.
template <typename CodesOf, typename ScalesOf>
void scatter_routes_fp8(const float* x, int64_t tokens, int top_k, int64_t hidden, CodesOf codes_of,
                        ScalesOf scales_of) {
  const int64_t tiles = (hidden + kFp8Tile - 1) / kFp8Tile;
#pragma omp parallel if (tokens * top_k * hidden >= kMinParallelWork)
  {
    std::vector<uint8_t> codes(static_cast<size_t>(hidden));
    std::vector<float> scales(static_cast<size_t>(tiles));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
      bool quantized = false;
      for (int k = 0; k < top_k; ++k) {
        uint8_t* code_row = codes_of(t * top_k + k);
        if (code_row == nullptr) continue;
        if (!quantized) fp8_quantize_row(x + t * hidden, hidden, codes.data(), scales.data());
        quantized = true;
        std::memcpy(code_row, codes.data(), codes.size());
        std::memcpy(scales_of(t * top_k + k), scales.data(), scales.size() * sizeof(float));
      }
    }
  }
}

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

// For each route i = t*K + k: kept (y_of(i) != nullptr): dweights[i] = dot(dout[t], y_of(i)) over D
// elements, FP32, ascending, then dy_of(i) = weights[i] * dout[t]; dropped: dweights[i] = 0 and
// no row is touched. The dot is taken before the store, so dy_of(i) may be the row y_of(i)
// (a received expert output that is used up).
template <typename YOf, typename DyOf>
void combine_backward_routes(float* dweights, const float* dout, const float* weights, int64_t tokens, int top_k,
                             int64_t hidden, YOf y_of, DyOf dy_of) {
  const int64_t D = hidden;
#pragma omp parallel for schedule(static) if (tokens * top_k * D >= kMinParallelWork)
  for (int64_t t = 0; t < tokens; ++t) {
    const float* g = dout + t * D;
    for (int k = 0; k < top_k; ++k) {
      const int64_t i = t * top_k + k;
      const float* y = y_of(i);
      if (y == nullptr) {
        dweights[i] = 0.0f;
        continue;
      }
      float dot = 0.0f;
      for (int64_t j = 0; j < D; ++j) dot += g[j] * y[j];
      dweights[i] = dot;
      float* dy = dy_of(i);
      if (dy == nullptr) continue;  // dweights only (combine_rows_weight_grad)
      const float w = weights[i];
      for (int64_t j = 0; j < D; ++j) dy[j] = w * g[j];
    }
  }
}

}  // namespace moe::cpu::route_rows

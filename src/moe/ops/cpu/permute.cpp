// CPU row movement. Tokens are independent, so loops run over tokens under OpenMP. Each loop
// that writes expert-buffer rows relies on route_index being injective (checked up front), so no
// two threads write the same row. Sums over k run in ascending k order in FP32.
#include "moe/ops/cpu/permute.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace moe::cpu {

namespace {

// Columns handled per pass when summing over k, so the partial sums stay in registers/L1.
constexpr int64_t kColumnChunk = 256;

// Below this many elements of work a loop runs on the calling thread: waking the OpenMP team
// costs more than the loop.
constexpr int64_t kMinParallelWork = 1 << 15;

void check_tensor(const Tensor& t, const char* op, const char* name) {
  MOE_CHECK(t.data != nullptr || t.numel() == 0, op, ": ", name, " has no data");
  MOE_CHECK(t.device == Device::CPU, op, ": ", name, " is on ", device_name(t.device), ", expected cpu");
}

void check_f32_2d(const Tensor& t, const char* op, const char* name) {
  check_tensor(t, op, name);
  MOE_CHECK(t.dtype == DType::F32, op, ": ", name, " has dtype ", dtype_name(t.dtype), ", expected F32");
  MOE_CHECK(t.ndim() == 2, op, ": ", name, " must be 2-D, got ", t.shape.str());
}

// route_index [T*K] I32 with entries -1 (dropped) or a row in [0, rows); with `injective`, no row
// is used twice (the op writes those rows in parallel).
void check_route_index(const Tensor& route_index, int64_t T, int top_k, int64_t rows, bool injective, const char* op) {
  check_tensor(route_index, op, "route_index");
  MOE_CHECK(route_index.dtype == DType::I32, op, ": route_index has dtype ", dtype_name(route_index.dtype),
            ", expected I32");
  MOE_CHECK(top_k >= 1, op, ": top_k = ", top_k, " must be at least 1");
  MOE_CHECK(route_index.numel() == T * top_k, op, ": route_index has shape ", route_index.shape.str(), ", expected [",
            T * top_k, "] (T = ", T, " times top_k = ", top_k, ")");
  const int32_t* index = route_index.i32();
  std::vector<uint8_t> used(injective ? static_cast<size_t>(rows) : 0, 0);
  for (int64_t i = 0; i < T * top_k; ++i) {
    const int32_t r = index[i];
    MOE_CHECK(r >= -1 && r < rows, op, ": route_index[", i, "] = ", r, " is neither -1 nor a row in [0, ", rows, ")");
    if (injective && r >= 0) {
      MOE_CHECK(!used[r], op, ": route_index[", i, "] = ", r, " repeats a row already used by another route");
      used[r] = 1;
    }
  }
}

}  // namespace

void gather_rows(Tensor dst, Tensor src, Tensor route_index, int top_k, Stream /*stream*/) {
  constexpr const char* op = "gather_rows";
  // Pure data movement: any element type, copied bytewise.
  check_tensor(dst, op, "dst");
  check_tensor(src, op, "src");
  MOE_CHECK(src.ndim() == 2 && dst.ndim() == 2, op, ": src ", src.shape.str(), " and dst ", dst.shape.str(),
            " must be 2-D");
  MOE_CHECK(src.dtype == dst.dtype, op, ": src has dtype ", dtype_name(src.dtype), " but dst has ",
            dtype_name(dst.dtype));
  MOE_CHECK(src.dim(1) == dst.dim(1), op, ": src ", src.shape.str(), " and dst ", dst.shape.str(),
            " differ in row width");
  const int64_t T = src.dim(0);
  check_route_index(route_index, T, top_k, dst.dim(0), /*injective=*/true, op);

  const int64_t D = src.dim(1);
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

void gather_rows_backward(Tensor dsrc, Tensor ddst, Tensor route_index, int top_k, bool accumulate, Stream /*stream*/) {
  constexpr const char* op = "gather_rows_backward";
  check_f32_2d(dsrc, op, "dsrc");
  check_f32_2d(ddst, op, "ddst");
  MOE_CHECK(dsrc.dim(1) == ddst.dim(1), op, ": dsrc ", dsrc.shape.str(), " and ddst ", ddst.shape.str(),
            " differ in row width");
  const int64_t T = dsrc.dim(0), D = dsrc.dim(1);
  check_route_index(route_index, T, top_k, ddst.dim(0), /*injective=*/false, op);

  const float* dd = ddst.f32();
  float* ds = dsrc.f32();
  const int32_t* index = route_index.i32();
#pragma omp parallel for schedule(static) if (T * top_k * D >= kMinParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    float acc[kColumnChunk];
    float* out = ds + t * D;
    for (int64_t c0 = 0; c0 < D; c0 += kColumnChunk) {
      const int64_t n = std::min(kColumnChunk, D - c0);
      std::fill(acc, acc + n, 0.0f);
      for (int k = 0; k < top_k; ++k) {
        const int32_t r = index[t * top_k + k];
        if (r < 0) continue;
        const float* row = dd + static_cast<int64_t>(r) * D + c0;
        for (int64_t j = 0; j < n; ++j) acc[j] += row[j];
      }
      if (accumulate)
        for (int64_t j = 0; j < n; ++j) out[c0 + j] += acc[j];
      else
        std::copy(acc, acc + n, out + c0);
    }
  }
}

void combine_rows(Tensor out, Tensor y, Tensor weights, Tensor route_index, int top_k, bool accumulate,
                  Stream /*stream*/) {
  constexpr const char* op = "combine_rows";
  check_f32_2d(out, op, "out");
  check_f32_2d(y, op, "y");
  check_f32_2d(weights, op, "weights");
  const int64_t T = out.dim(0), D = out.dim(1);
  MOE_CHECK(y.dim(1) == D, op, ": y ", y.shape.str(), " and out ", out.shape.str(), " differ in row width");
  MOE_CHECK(weights.dim(0) == T && weights.dim(1) == top_k, op, ": weights has shape ", weights.shape.str(),
            ", expected [", T, ", ", top_k, "]");
  check_route_index(route_index, T, top_k, y.dim(0), /*injective=*/false, op);

  const float* yv = y.f32();
  const float* w = weights.f32();
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
        const float wk = w[t * top_k + k];
        const float* row = yv + static_cast<int64_t>(r) * D + c0;
        for (int64_t j = 0; j < n; ++j) acc[j] += wk * row[j];
      }
      if (accumulate)
        for (int64_t j = 0; j < n; ++j) out_row[c0 + j] += acc[j];
      else
        std::copy(acc, acc + n, out_row + c0);
    }
  }
}

void combine_rows_backward(Tensor dy, Tensor dweights, Tensor dout, Tensor y, Tensor weights, Tensor route_index,
                           int top_k, Stream /*stream*/) {
  constexpr const char* op = "combine_rows_backward";
  check_f32_2d(dy, op, "dy");
  check_f32_2d(dweights, op, "dweights");
  check_f32_2d(dout, op, "dout");
  check_f32_2d(y, op, "y");
  check_f32_2d(weights, op, "weights");
  const int64_t T = dout.dim(0), D = dout.dim(1);
  MOE_CHECK(y.shape == dy.shape, op, ": dy ", dy.shape.str(), " and y ", y.shape.str(), " differ in shape");
  MOE_CHECK(y.dim(1) == D, op, ": y ", y.shape.str(), " and dout ", dout.shape.str(), " differ in row width");
  MOE_CHECK(weights.dim(0) == T && weights.dim(1) == top_k, op, ": weights has shape ", weights.shape.str(),
            ", expected [", T, ", ", top_k, "]");
  MOE_CHECK(dweights.shape == weights.shape, op, ": dweights has shape ", dweights.shape.str(), ", expected ",
            weights.shape.str());
  check_route_index(route_index, T, top_k, y.dim(0), /*injective=*/true, op);

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

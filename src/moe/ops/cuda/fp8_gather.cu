// FP8 operands of gathered token rows (moe/ops/fp8_gather.h): the quantizers of stored rows with
// sources that load each buffer row from its token's row, scaled by the route's weight and rounded
// as combine_rows_backward rounds (__fmul_rn, then to the element type): the codes and scales of
// quantizing the stored rows, without the scatter's or the combine backward's store of them and
// the quantizer's read back (two bytes per element each). The weighted BF16 rows in both layouts
// (the expert output gradient, the larger of the two) take the staged kernel the stored output
// gradients take (fp8_rows_and_columns_staged.cuh; the first version, one block per tile, ran at
// 1.33 ms per bench-olmoe-4l layer where the staged one quantizes the stored gradient in 0.97);
// the rest the columns kernel of fp8_tiles.cuh.
#include "moe/ops/cuda/fp8_gather.h"

#include <type_traits>

#include "moe/ops/cuda/fp8_rows_and_columns_staged.cuh"
#include "moe/ops/cuda/fp8_tiles.cuh"

namespace moe::cuda {
namespace {

using namespace fp8_tiles;

// Columns source: features kw .. kw + features - 1 of buffer row `row`, that is of token row
// route / top_k (times weights[route] unless weights is null). A row no route fills stays zero.
// vector: 16-byte loads of every token row are aligned.
template <typename T>
struct GatheredColumns {
  const T* x = nullptr;
  int64_t K = 0;
  const int32_t* route_of_row = nullptr;
  const float* weights = nullptr;
  int top_k = 1;
  int64_t routes = 0;
  __device__ __forceinline__ void load(Run16<T>& run, int64_t row, int64_t kw, int features, bool vector) const {
    const int32_t route = route_of_row[row];
    if (route < 0 || route >= routes) return;
    const T* p = x + static_cast<int64_t>(route / top_k) * K + kw;
    if (weights == nullptr) {
      run.load(p, features, vector);
      return;
    }
    Run16<T> v;
    v.load(p, features, vector);
    const float w = weights[route];
#pragma unroll
    for (int f = 0; f < kRun; ++f)
      if (f < features) run.set(f, __fmul_rn(w, v.get(f)));
  }
};

// The staged rows-and-columns kernel's source (fp8_rows_and_columns_staged.cuh): buffer row m is
// token row route / top_k, weighed by weights[route] (none for a row no route fills: zeros).
struct GatheredStagedRows {
  static constexpr bool kWeighted = true;
  const __nv_bfloat16* x = nullptr;
  int64_t K = 0;
  const int32_t* route_of_row = nullptr;
  const float* weights = nullptr;
  int top_k = 1;
  int64_t routes = 0;
  __device__ __forceinline__ const __nv_bfloat16* row(int64_t m) const {
    const int32_t route = route_of_row[m];
    return route < 0 || route >= routes ? nullptr : x + static_cast<int64_t>(route / top_k) * K;
  }
  __device__ __forceinline__ float weight(int64_t m) const {
    const int32_t route = route_of_row[m];
    return route < 0 || route >= routes ? 0.0f : weights[route];
  }
};

template <typename T>
void launch(const Fp8Tensor& columns, const GatheredRows& src, const Tensor& offsets, const Fp8Tensor* rows,
            const char* op, cudaStream_t s) {
  const int64_t M = src.route_of_row.dim(0), K = src.x.dim(1), Mp = columns.codes.dim(-1);
  if (K == 0 || Mp == 0) return;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // The expert output gradient (weighted, both layouts): the staged kernel, as for a stored gradient.
    if (rows != nullptr && !src.weights.empty() && rows_and_columns_staged_fit(src.x, K, *rows)) {
      const GatheredStagedRows source{src.x.ptr<const __nv_bfloat16>(), K, src.route_of_row.ptr<const int32_t>(),
                                      src.weights.ptr<const float>(), src.top_k, src.x.dim(0) * src.top_k};
      return launch_rows_and_columns_staged(columns, source, offsets, M, K, Mp, *rows, s);
    }
  }
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const bool vector = K % kVec == 0 && aligned(src.x.data, 16);
  const GatheredColumns<T> source{src.x.ptr<const T>(),
                                  K,
                                  src.route_of_row.ptr<const int32_t>(),
                                  src.weights.empty() ? nullptr : src.weights.ptr<const float>(),
                                  src.top_k,
                                  src.x.dim(0) * src.top_k};
  launch_columns<T>(columns, source, offsets, M, K, Mp, vector, rows, op, s);
}

void quantize(const Fp8Tensor& columns, const GatheredRows& src, const Tensor& offsets, const Fp8Tensor* rows,
              const char* op, Stream stream) {
  const cudaStream_t s = cuda_stream(stream);
  if (src.x.dtype == DType::BF16)
    launch<__nv_bfloat16>(columns, src, offsets, rows, op, s);
  else
    launch<float>(columns, src, offsets, rows, op, s);
}

}  // namespace

void fp8_quantize_gathered_columns(Fp8Tensor columns, const GatheredRows& src, Tensor offsets, Stream stream) {
  quantize(columns, src, offsets, nullptr, "fp8_quantize_gathered_columns", stream);
}

void fp8_quantize_gathered_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, const GatheredRows& src,
                                            Tensor offsets, Stream stream) {
  quantize(columns, src, offsets, &rows, "fp8_quantize_gathered_rows_and_columns", stream);
}

}  // namespace moe::cuda

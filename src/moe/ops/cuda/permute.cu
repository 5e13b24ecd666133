// CUDA row movement between token order and the expert-major buffer, and the weighted combine.
//   scatter_rows_to_routes (and its backward and FP8 form), combine_rows, combine_rows_backward: one block per
//     token over its K routed rows, the kernels of route_rows.cuh (shared with the GPU rowwise
//     dispatcher) on rows of a local buffer: the scatter reads the token's row once and stores it
//     K times; sums over k in ascending order in FP32, rounded once on store; the dweights dot
//     products in a fixed-order block reduction.
// No atomics: each output element is written by exactly one thread, so results are deterministic.
//
// NOTES: products and sums use __fmul_rn/__fadd_rn, which the compiler never fuses into an FMA: in
// F32 the combine and the gather backward round exactly like the CPU's loops (same order, same
// operations). The dot products of combine_rows_backward sum in another order than the CPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/element.cuh"
#include "moe/ops/cuda/permute.h"
#include "moe/ops/cuda/route_rows.cuh"

namespace moe::cuda {

namespace {

// True when route row r is a kept row of a buffer with `rows` rows.
__device__ __forceinline__ bool kept(int32_t r, int64_t rows) { return r >= 0 && r < rows; }

// A route's row in a local [rows, D] buffer, nullptr when dropped (route_rows.cuh's Row functor).
template <typename Elem>
struct LocalRow {
  Elem* base;
  int64_t rows, D;
  __device__ __forceinline__ Elem* operator()(int32_t v) const {
    return kept(v, rows) ? base + static_cast<int64_t>(v) * D : nullptr;
  }
};

// No row (combine_rows_weight_grad stores no dy).
template <typename Elem>
struct NoRow {
  __device__ __forceinline__ Elem* operator()(int32_t) const { return nullptr; }
};

// route_of_row[route_index[i]] = i for kept routes (rows out of range are dropped, as elsewhere).
__global__ void invert_route_index_kernel(int32_t* route_of_row, const int32_t* route_index, int64_t routes,
                                          int64_t rows) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < routes;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (kept(route_index[i], rows)) route_of_row[route_index[i]] = static_cast<int32_t>(i);
}

// out[t] (= or +=) sum over kept k, in k order, of (weights ? weights[t, k] : 1) * rows[route_index[t*K+k]]:
// the combine, and without weights the scatter's gradient.
void sum_routes(Tensor out, Tensor rows, const float* weights, Tensor route_index, int top_k, bool accumulate,
                Stream stream) {
  const int64_t T = out.dim(0), D = out.dim(1);
  if (T == 0 || D == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  with_vec_width(out.dtype, D, {out.data, rows.data}, [&](auto row_type) {
    using Elem = typename decltype(row_type)::elem;
    constexpr int V = decltype(row_type)::width;
    route_rows::launch_sum_routes<Elem, V>(
        static_cast<Elem*>(out.data), LocalRow<const Elem>{static_cast<const Elem*>(rows.data), rows.dim(0), D},
        weights, accumulate, route_index.i32(), top_k, T, D, s);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void scatter_rows_to_routes(Tensor dst, Tensor src, Tensor route_index, int top_k, Stream stream) {
  const int64_t T = src.dim(0);
  const int64_t routes = T * top_k;
  const int64_t row_bytes = src.dim(1) * static_cast<int64_t>(dtype_size(src.dtype));
  if (routes == 0 || row_bytes == 0) return;

  // Pure data movement: copied in 16-byte words where the row size and both buffers allow it.
  const int64_t D = src.dim(1);
  with_vec_width(src.dtype, D, {src.data, dst.data}, [&](auto row_type) {
    using Elem = typename decltype(row_type)::elem;
    constexpr int V = decltype(row_type)::width;
    route_rows::launch_scatter_routes<Elem, V>(static_cast<const Elem*>(src.data),
                                               LocalRow<Elem>{static_cast<Elem*>(dst.data), dst.dim(0), D},
                                               route_index.i32(), top_k, T, D, cuda_stream(stream));
  });
  CUDA_CHECK_LAUNCH();
}

void scatter_rows_to_routes_fp8(Fp8Tensor dst, Tensor src, Tensor route_index, int top_k, Stream stream) {
  const int64_t T = src.dim(0), D = src.dim(1);
  if (T == 0 || D == 0) return;
  const int64_t rows = dst.codes.dim(0), tiles = dst.scales.dim(1);
  const bool word_stores = D % 4 == 0 && reinterpret_cast<uintptr_t>(dst.codes.data) % 4 == 0;
  auto launch = [&](auto elem) {
    using Elem = decltype(elem);
    route_rows::launch_scatter_routes_fp8<Elem>(
        static_cast<const Elem*>(src.data), LocalRow<uint8_t>{dst.codes.ptr<uint8_t>(), rows, D},
        LocalRow<float>{dst.scales.f32(), rows, tiles}, route_index.i32(), top_k, T, D, word_stores,
        cuda_stream(stream));
  };
  if (src.dtype == DType::BF16)
    launch(__nv_bfloat16{});
  else
    launch(float{});
  CUDA_CHECK_LAUNCH();
}

void scatter_rows_to_routes_backward(Tensor dsrc, Tensor ddst, Tensor route_index, int top_k, bool accumulate,
                                     Stream stream) {
  sum_routes(dsrc, ddst, /*weights=*/nullptr, route_index, top_k, accumulate, stream);
}

void combine_rows(Tensor out, Tensor y, Tensor weights, Tensor route_index, int top_k, bool accumulate,
                  Stream stream) {
  sum_routes(out, y, weights.f32(), route_index, top_k, accumulate, stream);
}

void combine_rows_backward(Tensor dy, Tensor dweights, Tensor dout, Tensor y, Tensor weights, Tensor route_index,
                           int top_k, Stream stream) {
  const int64_t T = dout.dim(0), D = dout.dim(1);
  if (T == 0) return;
  // D == 0 still runs: dweights are written (all zeros) as on the CPU.
  const cudaStream_t s = cuda_stream(stream);
  with_vec_width(dout.dtype, D, {dout.data, y.data, dy.data}, [&](auto row_type) {
    using Elem = typename decltype(row_type)::elem;
    constexpr int V = decltype(row_type)::width;
    route_rows::launch_combine_backward<Elem, V>(
        dweights.f32(), static_cast<const Elem*>(dout.data), weights.f32(),
        LocalRow<const Elem>{static_cast<const Elem*>(y.data), y.dim(0), D},
        LocalRow<Elem>{static_cast<Elem*>(dy.data), dy.dim(0), D}, route_index.i32(), top_k, T, D, s);
  });
  CUDA_CHECK_LAUNCH();
}

// The dot products' order follows the vector width: the same as combine_rows_backward's (and the
// rowwise dispatcher's) whenever dy and the heap are 16-byte aligned, as arena and heap buffers are.
void combine_rows_weight_grad(Tensor dweights, Tensor dout, Tensor y, Tensor route_index, int top_k,
                              Stream stream) {
  const int64_t T = dout.dim(0), D = dout.dim(1);
  if (T == 0) return;
  with_vec_width(dout.dtype, D, {dout.data, y.data}, [&](auto row_type) {
    using Elem = typename decltype(row_type)::elem;
    constexpr int V = decltype(row_type)::width;
    route_rows::launch_combine_backward<Elem, V>(
        dweights.f32(), static_cast<const Elem*>(dout.data), /*weights=*/nullptr,
        LocalRow<const Elem>{static_cast<const Elem*>(y.data), y.dim(0), D}, NoRow<Elem>{}, route_index.i32(), top_k,
        T, D, cuda_stream(stream));
  });
  CUDA_CHECK_LAUNCH();
}

void invert_route_index(Tensor route_of_row, Tensor route_index, Stream stream) {
  const int64_t rows = route_of_row.numel(), routes = route_index.numel();
  if (rows == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  CUDA_CHECK(cudaMemsetAsync(route_of_row.data, 0xff, static_cast<size_t>(rows) * sizeof(int32_t), s));  // -1
  if (routes == 0) return;
  invert_route_index_kernel<<<grid_stride_blocks(routes, 256), 256, 0, s>>>(route_of_row.i32(), route_index.i32(),
                                                                          routes, rows);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda

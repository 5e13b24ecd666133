// CUDA row movement between token order and the expert-major buffer, and the weighted combine.
//   gather_rows, gather_rows_backward, combine_rows, combine_rows_backward: one block per token
//     over its K routed rows, the kernels of route_rows.cuh (shared with the GPU rowwise
//     dispatcher) on rows of a local buffer: the gather reads the token's row once and stores it
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


void check_tensor(const Tensor& t, const char* op, const char* name) {
  MOE_CHECK(t.data != nullptr || t.numel() == 0, op, ": ", name, " has no data");
  MOE_CHECK(t.device == Device::CUDA, op, ": ", name, " is on ", device_name(t.device), ", expected cuda");
}

// A 2-D row tensor of dtype F32 or BF16.
void check_rows(const Tensor& t, const char* op, const char* name) {
  check_tensor(t, op, name);
  MOE_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, op, ": ", name, " has dtype ", dtype_name(t.dtype),
            ", expected F32 or BF16");
  MOE_CHECK(t.ndim() == 2, op, ": ", name, " must be 2-D, got ", t.shape.str());
}

void check_same_dtype(const Tensor& a, const char* a_name, const Tensor& b, const char* b_name, const char* op) {
  MOE_CHECK(a.dtype == b.dtype, op, ": ", a_name, " has dtype ", dtype_name(a.dtype), " but ", b_name, " has ",
            dtype_name(b.dtype), "; the row tensors of one call share one dtype");
}

void check_f32_2d(const Tensor& t, const char* op, const char* name) {
  check_tensor(t, op, name);
  MOE_CHECK(t.dtype == DType::F32, op, ": ", name, " has dtype ", dtype_name(t.dtype), ", expected F32");
  MOE_CHECK(t.ndim() == 2, op, ": ", name, " must be 2-D, got ", t.shape.str());
}

// Shape and dtype only: the entries are on the device (see permute.h for how bad entries behave).
void check_route_index(const Tensor& route_index, int64_t T, int top_k, const char* op) {
  check_tensor(route_index, op, "route_index");
  MOE_CHECK(route_index.dtype == DType::I32, op, ": route_index has dtype ", dtype_name(route_index.dtype),
            ", expected I32");
  MOE_CHECK(top_k >= 1, op, ": top_k = ", top_k, " must be at least 1");
  MOE_CHECK(route_index.numel() == T * top_k, op, ": route_index has shape ", route_index.shape.str(), ", expected [",
            T * top_k, "] (T = ", T, " times top_k = ", top_k, ")");
}



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

}  // namespace

void gather_rows(Tensor dst, Tensor src, Tensor route_index, int top_k, Stream stream) {
  constexpr const char* op = "gather_rows";
  check_rows(dst, op, "dst");
  check_rows(src, op, "src");
  check_same_dtype(src, "src", dst, "dst", op);
  MOE_CHECK(src.dim(1) == dst.dim(1), op, ": src ", src.shape.str(), " and dst ", dst.shape.str(),
            " differ in row width");
  const int64_t T = src.dim(0);
  check_route_index(route_index, T, top_k, op);
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

void gather_rows_backward(Tensor dsrc, Tensor ddst, Tensor route_index, int top_k, bool accumulate, Stream stream) {
  constexpr const char* op = "gather_rows_backward";
  check_rows(dsrc, op, "dsrc");
  check_rows(ddst, op, "ddst");
  check_same_dtype(dsrc, "dsrc", ddst, "ddst", op);
  MOE_CHECK(dsrc.dim(1) == ddst.dim(1), op, ": dsrc ", dsrc.shape.str(), " and ddst ", ddst.shape.str(),
            " differ in row width");
  const int64_t T = dsrc.dim(0), D = dsrc.dim(1);
  check_route_index(route_index, T, top_k, op);
  if (T == 0 || D == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  with_vec_width(dsrc.dtype, D, {dsrc.data, ddst.data}, [&](auto row_type) {
    using Elem = typename decltype(row_type)::elem;
    constexpr int V = decltype(row_type)::width;
    route_rows::launch_sum_routes<Elem, V>(
        static_cast<Elem*>(dsrc.data), LocalRow<const Elem>{static_cast<const Elem*>(ddst.data), ddst.dim(0), D},
        /*weights=*/nullptr, accumulate, route_index.i32(), top_k, T, D, s);
  });
  CUDA_CHECK_LAUNCH();
}

void combine_rows(Tensor out, Tensor y, Tensor weights, Tensor route_index, int top_k, bool accumulate,
                  Stream stream) {
  constexpr const char* op = "combine_rows";
  check_rows(out, op, "out");
  check_rows(y, op, "y");
  check_same_dtype(out, "out", y, "y", op);
  check_f32_2d(weights, op, "weights");
  const int64_t T = out.dim(0), D = out.dim(1);
  MOE_CHECK(y.dim(1) == D, op, ": y ", y.shape.str(), " and out ", out.shape.str(), " differ in row width");
  MOE_CHECK(weights.dim(0) == T && weights.dim(1) == top_k, op, ": weights has shape ", weights.shape.str(),
            ", expected [", T, ", ", top_k, "]");
  check_route_index(route_index, T, top_k, op);
  if (T == 0 || D == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  with_vec_width(out.dtype, D, {out.data, y.data}, [&](auto row_type) {
    using Elem = typename decltype(row_type)::elem;
    constexpr int V = decltype(row_type)::width;
    route_rows::launch_sum_routes<Elem, V>(
        static_cast<Elem*>(out.data), LocalRow<const Elem>{static_cast<const Elem*>(y.data), y.dim(0), D},
        weights.f32(), accumulate, route_index.i32(), top_k, T, D, s);
  });
  CUDA_CHECK_LAUNCH();
}

void combine_rows_backward(Tensor dy, Tensor dweights, Tensor dout, Tensor y, Tensor weights, Tensor route_index,
                           int top_k, Stream stream) {
  constexpr const char* op = "combine_rows_backward";
  check_rows(dy, op, "dy");
  check_rows(dout, op, "dout");
  check_rows(y, op, "y");
  check_same_dtype(dout, "dout", y, "y", op);
  check_same_dtype(dout, "dout", dy, "dy", op);
  check_f32_2d(dweights, op, "dweights");
  check_f32_2d(weights, op, "weights");
  const int64_t T = dout.dim(0), D = dout.dim(1);
  MOE_CHECK(y.shape == dy.shape, op, ": dy ", dy.shape.str(), " and y ", y.shape.str(), " differ in shape");
  MOE_CHECK(y.dim(1) == D, op, ": y ", y.shape.str(), " and dout ", dout.shape.str(), " differ in row width");
  MOE_CHECK(weights.dim(0) == T && weights.dim(1) == top_k, op, ": weights has shape ", weights.shape.str(),
            ", expected [", T, ", ", top_k, "]");
  MOE_CHECK(dweights.shape == weights.shape, op, ": dweights has shape ", dweights.shape.str(), ", expected ",
            weights.shape.str());
  check_route_index(route_index, T, top_k, op);
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

}  // namespace moe::cuda

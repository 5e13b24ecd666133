// CUDA row movement between token order and the expert-major buffer, and the weighted combine.
//   gather_rows: one block per route copies the token's row (16-byte words where the row and both
//     buffers allow it);
//   gather_rows_backward, combine_rows: one block per token, one thread per column, summing over
//     k in ascending order in FP32 and rounding once on store;
//   combine_rows_backward: one block per token; for each k the block writes dy's row and reduces
//     the dot product for dweights with a fixed-order block reduction.
// No atomics: each output element is written by exactly one thread, so results are deterministic.
//
// NOTES: products and sums in combine_rows use __fmul_rn/__fadd_rn, which the compiler never fuses
// into an FMA: in F32 the result then rounds exactly like the CPU's loop (same order, same
// operations). The dot products of combine_rows_backward sum in another order than the CPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/element.cuh"
#include "moe/ops/cuda/permute.h"

namespace moe::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride loops beyond this many rows
constexpr unsigned kFullMask = 0xffffffffu;

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


unsigned grid_for(int64_t items) { return static_cast<unsigned>(std::min(items, kMaxBlocks)); }

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// True when route row r is a kept row of a buffer with `rows` rows.
__device__ __forceinline__ bool kept(int32_t r, int64_t rows) { return r >= 0 && r < rows; }

// Fixed-order block sum (warp trees, then warps in index order); every thread gets it and every
// thread of the block must call it.
__device__ float block_sum(float v) {
  __shared__ float warp_totals[kWarps];
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  if (threadIdx.x % kWarp == 0) warp_totals[threadIdx.x / kWarp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += warp_totals[w];
  __syncthreads();  // warp_totals may be reused by the next call
  return total;
}

// dst[route_index[i]] = src[i / top_k], row_words words of type Word per row.
template <typename Word>
__global__ void gather_rows_kernel(Word* __restrict__ dst, const Word* __restrict__ src,
                                   const int32_t* __restrict__ route_index, int top_k, int64_t routes,
                                   int64_t dst_rows, int64_t row_words) {
  for (int64_t i = blockIdx.x; i < routes; i += gridDim.x) {
    const int32_t r = route_index[i];
    if (!kept(r, dst_rows)) continue;  // dropped route: nothing to move
    const Word* from = src + (i / top_k) * row_words;
    Word* to = dst + static_cast<int64_t>(r) * row_words;
    for (int64_t c = threadIdx.x; c < row_words; c += blockDim.x) to[c] = from[c];
  }
}

template <typename Word>
void launch_gather(const Tensor& dst, const Tensor& src, const Tensor& route_index, int top_k, int64_t routes,
                   int64_t row_bytes, cudaStream_t stream) {
  gather_rows_kernel<Word><<<grid_for(routes), kThreads, 0, stream>>>(
      static_cast<Word*>(dst.data), static_cast<const Word*>(src.data), route_index.i32(), top_k, routes,
      dst.dim(0), row_bytes / static_cast<int64_t>(sizeof(Word)));
  CUDA_CHECK_LAUNCH();
}

// dsrc[t] (= or +=) sum over kept k, ascending, of ddst[route_index[t*K+k]].
template <typename Elem>
__global__ void gather_rows_backward_kernel(Elem* __restrict__ dsrc, const Elem* __restrict__ ddst,
                                            const int32_t* __restrict__ route_index, int top_k, int64_t T, int64_t D,
                                            int64_t ddst_rows, bool accumulate) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int32_t* rows = route_index + t * top_k;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
      float acc = 0.0f;
      for (int k = 0; k < top_k; ++k) {
        const int32_t r = rows[k];
        if (kept(r, ddst_rows)) acc += to_f32(ddst[static_cast<int64_t>(r) * D + c]);
      }
      Elem* out = dsrc + t * D + c;
      store(out, accumulate ? to_f32(*out) + acc : acc);
    }
  }
}

// out[t] (= or +=) sum over kept k, ascending, of weights[t,k] * y[route_index[t*K+k]].
template <typename Elem>
__global__ void combine_rows_kernel(Elem* __restrict__ out, const Elem* __restrict__ y,
                                    const float* __restrict__ weights, const int32_t* __restrict__ route_index,
                                    int top_k, int64_t T, int64_t D, int64_t y_rows, bool accumulate) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int32_t* rows = route_index + t * top_k;
    const float* w = weights + t * top_k;
    for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
      float acc = 0.0f;
      for (int k = 0; k < top_k; ++k) {
        const int32_t r = rows[k];
        if (kept(r, y_rows)) acc = __fadd_rn(acc, __fmul_rn(w[k], to_f32(y[static_cast<int64_t>(r) * D + c])));
      }
      Elem* o = out + t * D + c;
      store(o, accumulate ? __fadd_rn(to_f32(*o), acc) : acc);
    }
  }
}

// dy[route_index[t*K+k]] = weights[t,k] * dout[t]; dweights[t,k] = dot(dout[t], y[row]) (0 if dropped).
template <typename Elem>
__global__ void combine_rows_backward_kernel(Elem* __restrict__ dy, float* __restrict__ dweights,
                                             const Elem* __restrict__ dout, const Elem* __restrict__ y,
                                             const float* __restrict__ weights,
                                             const int32_t* __restrict__ route_index, int top_k, int64_t T,
                                             int64_t D, int64_t y_rows) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const Elem* g = dout + t * D;
    for (int k = 0; k < top_k; ++k) {
      const int64_t i = t * top_k + k;
      const int32_t r = route_index[i];
      if (!kept(r, y_rows)) {  // the same r for the whole block: no thread reaches block_sum below
        if (threadIdx.x == 0) dweights[i] = 0.0f;
        continue;
      }
      const float wk = weights[i];
      const Elem* y_row = y + static_cast<int64_t>(r) * D;
      Elem* dy_row = dy + static_cast<int64_t>(r) * D;
      float dot = 0.0f;
      for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
        const float gc = to_f32(g[c]);
        dot = fmaf(gc, to_f32(y_row[c]), dot);
        store(dy_row + c, __fmul_rn(wk, gc));
      }
      dot = block_sum(dot);
      if (threadIdx.x == 0) dweights[i] = dot;
    }
  }
}

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

  // Pure data movement: copied in the widest word that the row size and both buffers allow.
  const auto aligned = [&](int64_t word) {
    return row_bytes % word == 0 && reinterpret_cast<uintptr_t>(src.data) % word == 0 &&
           reinterpret_cast<uintptr_t>(dst.data) % word == 0;
  };
  const cudaStream_t s = cuda_stream(stream);
  if (aligned(16))
    launch_gather<uint4>(dst, src, route_index, top_k, routes, row_bytes, s);
  else if (aligned(4))
    launch_gather<uint32_t>(dst, src, route_index, top_k, routes, row_bytes, s);
  else
    launch_gather<uint16_t>(dst, src, route_index, top_k, routes, row_bytes, s);
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
  if (dsrc.dtype == DType::F32)
    gather_rows_backward_kernel<float><<<grid_for(T), kThreads, 0, s>>>(
        dsrc.ptr<float>(), ddst.ptr<const float>(), route_index.i32(), top_k, T, D, ddst.dim(0), accumulate);
  else
    gather_rows_backward_kernel<__nv_bfloat16><<<grid_for(T), kThreads, 0, s>>>(
        dsrc.ptr<__nv_bfloat16>(), ddst.ptr<const __nv_bfloat16>(), route_index.i32(), top_k, T, D, ddst.dim(0),
        accumulate);
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
  if (out.dtype == DType::F32)
    combine_rows_kernel<float><<<grid_for(T), kThreads, 0, s>>>(out.ptr<float>(), y.ptr<const float>(),
                                                                weights.f32(), route_index.i32(), top_k, T, D,
                                                                y.dim(0), accumulate);
  else
    combine_rows_kernel<__nv_bfloat16><<<grid_for(T), kThreads, 0, s>>>(
        out.ptr<__nv_bfloat16>(), y.ptr<const __nv_bfloat16>(), weights.f32(), route_index.i32(), top_k, T, D,
        y.dim(0), accumulate);
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
  if (dout.dtype == DType::F32)
    combine_rows_backward_kernel<float><<<grid_for(T), kThreads, 0, s>>>(
        dy.ptr<float>(), dweights.f32(), dout.ptr<const float>(), y.ptr<const float>(), weights.f32(),
        route_index.i32(), top_k, T, D, y.dim(0));
  else
    combine_rows_backward_kernel<__nv_bfloat16><<<grid_for(T), kThreads, 0, s>>>(
        dy.ptr<__nv_bfloat16>(), dweights.f32(), dout.ptr<const __nv_bfloat16>(), y.ptr<const __nv_bfloat16>(),
        weights.f32(), route_index.i32(), top_k, T, D, y.dim(0));
  CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda

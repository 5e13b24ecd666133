// CUDA embedding lookup/accumulation and element-wise helpers (see moe/ops/embedding.h and
// moe/ops/cuda/embedding.h for the dtype contract).
//
// Kernels:
//   embedding_forward_kernel   one thread per output element, grid-stride; copies T bits.
//   embedding_backward_kernel  grid (column blocks of 256, vocab partitions P): thread (c, p)
//                              owns column c of every vocab row v with v % P == p and walks all
//                              rows r in order, adding dout[r, c] into dtable[tokens[r], c] when
//                              tokens[r] is in its partition. Each dtable element has exactly one
//                              owner thread that adds its contributions in row order: no races,
//                              no atomics, and the same FP32 additions in the same order as the
//                              CPU op (bit-identical). P only spreads the work; it does not change
//                              the result.
//   add_inplace_kernel         one thread per element, grid-stride, sum in FP32.
//   cast_kernel                one thread per element, grid-stride.
//   accumulate_scalars_kernel  one thread applies up to kMaxScalarTerms terms, passed by value in
//                              the kernel's parameters, in order.
// fill_zero and copy (and cast_copy between equal dtypes) are cudaMemsetAsync/cudaMemcpyAsync.
// NOTES: every thread of embedding_backward reads all R token ids (cached, warp-uniform
// branch); a skewed token distribution loads one partition more than the others.
#include "moe/ops/cuda/embedding.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/element.cuh"

namespace moe::cuda {
namespace {


// Bit-identical to moe::f32_to_bf16 (round to nearest even; a NaN stays a quiet NaN with its sign
// and top payload bits), so a device refresh of BF16 weights equals the host one, NaNs included.
__device__ __forceinline__ __nv_bfloat16 f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  uint16_t h;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    h = static_cast<uint16_t>((u >> 16) | 0x40);
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
    h = static_cast<uint16_t>(u >> 16);
  }
  return __ushort_as_bfloat16(h);
}

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 16;
constexpr int kBackwardColumns = 256;     // columns per block in embedding_backward
constexpr int64_t kBackwardTargetBlocks = 512;  // about 4 blocks per SM on an H200 (132 SMs)
constexpr int64_t kMaxPartitions = 64;
constexpr int kMaxScalarTerms = 64;  // accumulate_scalars terms per launch (24 bytes each)

unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

#define MOE_GRID_STRIDE(idx, n)                                                                 \
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < (n); \
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void __launch_bounds__(kThreads)
    embedding_forward_kernel(T* out, const T* table, const int32_t* tokens, int64_t R, int64_t D, int64_t V) {
  MOE_GRID_STRIDE(idx, R * D) {
    const int64_t r = idx / D, c = idx % D;
    const int32_t tok = tokens[r];
    out[idx] = (tok >= 0 && tok < V) ? table[static_cast<int64_t>(tok) * D + c] : from_f32<T>(__int_as_float(0x7fc00000));
  }
}

template <typename T>
__global__ void __launch_bounds__(kBackwardColumns)
    embedding_backward_kernel(float* dtable, const T* dout, const int32_t* tokens, int64_t R, int64_t D, int64_t V,
                              int partitions) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kBackwardColumns + threadIdx.x;
  const int partition = static_cast<int>(blockIdx.y);
  if (c >= D) return;
  for (int64_t r = 0; r < R; ++r) {
    const int32_t tok = __ldg(tokens + r);
    if (tok < 0 || tok >= V || tok % partitions != partition) continue;
    dtable[static_cast<int64_t>(tok) * D + c] += to_f32(dout[r * D + c]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) add_inplace_kernel(T* y, const T* x, int64_t n) {
  MOE_GRID_STRIDE(i, n) { y[i] = from_f32<T>(to_f32(y[i]) + to_f32(x[i])); }
}

__global__ void __launch_bounds__(kThreads) cast_f32_to_bf16_kernel(__nv_bfloat16* dst, const float* src, int64_t n) {
  MOE_GRID_STRIDE(i, n) { dst[i] = f32_to_bf16_bits(src[i]); }
}

__global__ void __launch_bounds__(kThreads) cast_bf16_to_f32_kernel(float* dst, const __nv_bfloat16* src, int64_t n) {
  MOE_GRID_STRIDE(i, n) { dst[i] = __bfloat162float(src[i]); }
}

// One term of accumulate_scalars as the kernel sees it: the address of the element, not the tensor.
struct ScalarTermArg {
  const void* value;  // src's element `index`: an int32_t when is_int, else a float
  int64_t slot;
  float scale;
  int is_int;
};

struct ScalarTermBatch {
  ScalarTermArg terms[kMaxScalarTerms];
  int count;
};

// A single thread, terms in order. __fmul_rn/__fadd_rn keep the product and the sum separately
// rounded (no fused multiply-add), as on the CPU. No restrict: a term's src may be stats itself.
__global__ void accumulate_scalars_kernel(float* stats, const ScalarTermBatch batch) {
  for (int i = 0; i < batch.count; ++i) {
    const ScalarTermArg& term = batch.terms[i];
    const float value = term.is_int ? static_cast<float>(*static_cast<const int32_t*>(term.value))
                                    : *static_cast<const float*>(term.value);
    stats[term.slot] = __fadd_rn(stats[term.slot], __fmul_rn(term.scale, value));
  }
}

#undef MOE_GRID_STRIDE

void check_cuda(const char* op, const char* name, const Tensor& t) {
  MOE_CHECK(t.device == Device::CUDA, op, ": tensor ", name, " is not on the CUDA device");
}

void check_float_type(const char* op, const char* name, const Tensor& t) {
  check_cuda(op, name, t);
  MOE_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, op, ": tensor ", name, " must be F32 or BF16, got ",
            dtype_name(t.dtype));
}

// stats is F32 on the device; every term's src is F32 or I32 there, its index inside src and its
// slot inside stats.
void check_scalar_terms(const char* op, const Tensor& stats, const std::vector<ScalarTerm>& terms) {
  check_cuda(op, "stats", stats);
  MOE_CHECK(stats.dtype == DType::F32, op, ": tensor stats must be F32, got ", dtype_name(stats.dtype));
  MOE_CHECK(stats.data != nullptr || stats.numel() == 0, op, ": stats has no data");
  for (size_t i = 0; i < terms.size(); ++i) {
    const ScalarTerm& term = terms[i];
    MOE_CHECK(term.src.device == Device::CUDA, op, ": terms[", i, "].src is not on the CUDA device (stats is)");
    MOE_CHECK(term.src.dtype == DType::F32 || term.src.dtype == DType::I32, op, ": terms[", i,
              "].src must be F32 or I32, got ", dtype_name(term.src.dtype));
    MOE_CHECK(term.index >= 0 && term.index < term.src.numel() && term.src.data != nullptr, op, ": terms[", i,
              "].index = ", term.index, " is outside src ", term.src.shape.str());
    MOE_CHECK(term.slot >= 0 && term.slot < stats.numel(), op, ": terms[", i, "].slot = ", term.slot,
              " is outside stats ", stats.shape.str());
  }
}

// Shared checks of the lookup and its gradient: devices, dtypes, [R, D] rows, [V, D] table.
void check_embedding(const char* op, const Tensor& rows, const char* rows_name, const Tensor& table,
                     const char* table_name, const Tensor& tokens) {
  check_float_type(op, rows_name, rows);
  check_float_type(op, table_name, table);
  check_cuda(op, "tokens", tokens);
  MOE_CHECK(tokens.dtype == DType::I32, op, ": tokens must be I32, got ", dtype_name(tokens.dtype));
  MOE_CHECK(table.ndim() == 2, op, ": ", table_name, " must be 2-D [V, D], got ", table.shape.str());
  MOE_CHECK(rows.ndim() == 2 && rows.dim(0) == tokens.numel() && rows.dim(1) == table.dim(1), op, ": ",
            rows_name, " ", rows.shape.str(), " must be [R, D] = [", tokens.numel(), ", ", table.dim(1), "]");
}

}  // namespace

void embedding_forward(Tensor out, Tensor table, Tensor tokens, Stream stream) {
  const char* op = "embedding_forward";
  check_embedding(op, out, "out", table, "table", tokens);
  MOE_CHECK(out.dtype == table.dtype, op, ": out ", dtype_name(out.dtype), " and table ", dtype_name(table.dtype),
            " must share one dtype");
  const int64_t R = out.dim(0), D = out.dim(1), V = table.dim(0);
  if (R * D == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (table.dtype == DType::F32)
    embedding_forward_kernel<float><<<grid_for(R * D), kThreads, 0, s>>>(out.ptr<float>(), table.ptr<const float>(),
                                                                         tokens.ptr<const int32_t>(), R, D, V);
  else
    embedding_forward_kernel<__nv_bfloat16><<<grid_for(R * D), kThreads, 0, s>>>(
        out.ptr<__nv_bfloat16>(), table.ptr<const __nv_bfloat16>(), tokens.ptr<const int32_t>(), R, D, V);
  CUDA_CHECK_LAUNCH();
}

void embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Stream stream) {
  const char* op = "embedding_backward";
  check_embedding(op, dout, "dout", dtable, "dtable", tokens);
  MOE_CHECK(dtable.dtype == DType::F32, op, ": dtable must be F32 (an FP32 gradient accumulator), got ",
            dtype_name(dtable.dtype));
  const int64_t R = dout.dim(0), D = dout.dim(1), V = dtable.dim(0);
  if (R * D == 0 || V == 0) return;
  const int64_t column_blocks = (D + kBackwardColumns - 1) / kBackwardColumns;
  const int64_t partitions =
      std::min({V, kMaxPartitions, std::max<int64_t>(1, kBackwardTargetBlocks / column_blocks)});
  const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(partitions));
  const cudaStream_t s = cuda_stream(stream);
  if (dout.dtype == DType::F32)
    embedding_backward_kernel<float><<<grid, kBackwardColumns, 0, s>>>(
        dtable.ptr<float>(), dout.ptr<const float>(), tokens.ptr<const int32_t>(), R, D, V, static_cast<int>(partitions));
  else
    embedding_backward_kernel<__nv_bfloat16><<<grid, kBackwardColumns, 0, s>>>(
        dtable.ptr<float>(), dout.ptr<const __nv_bfloat16>(), tokens.ptr<const int32_t>(), R, D, V, static_cast<int>(partitions));
  CUDA_CHECK_LAUNCH();
}

void add_inplace(Tensor y, Tensor x, Stream stream) {
  const char* op = "add_inplace";
  check_float_type(op, "y", y);
  check_float_type(op, "x", x);
  MOE_CHECK(y.dtype == x.dtype, "add_inplace: y ", dtype_name(y.dtype), " and x ", dtype_name(x.dtype),
            " differ in dtype");
  MOE_CHECK(y.shape == x.shape, "add_inplace: y ", y.shape.str(), " and x ", x.shape.str(), " differ in shape");
  const int64_t n = y.numel();
  if (n == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (y.dtype == DType::F32)
    add_inplace_kernel<float><<<grid_for(n), kThreads, 0, s>>>(y.ptr<float>(), x.ptr<const float>(), n);
  else
    add_inplace_kernel<__nv_bfloat16>
        <<<grid_for(n), kThreads, 0, s>>>(y.ptr<__nv_bfloat16>(), x.ptr<const __nv_bfloat16>(), n);
  CUDA_CHECK_LAUNCH();
}

void fill_zero(Tensor y, Stream stream) {
  check_cuda("fill_zero", "y", y);
  if (y.nbytes() > 0) CUDA_CHECK(cudaMemsetAsync(y.data, 0, y.nbytes(), cuda_stream(stream)));
}

void copy(Tensor dst, Tensor src, Stream stream) {
  check_cuda("copy", "dst", dst);
  check_cuda("copy", "src", src);
  MOE_CHECK(dst.shape == src.shape && dst.dtype == src.dtype, "copy: dst ", dst.shape.str(), " ",
            dtype_name(dst.dtype), " and src ", src.shape.str(), " ", dtype_name(src.dtype), " differ");
  if (dst.nbytes() > 0 && dst.data != src.data)
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.nbytes(), cudaMemcpyDeviceToDevice,
                               cuda_stream(stream)));
}

void cast_copy(Tensor dst, Tensor src, Stream stream) {
  const char* op = "cast_copy";
  check_cuda(op, "dst", dst);
  check_cuda(op, "src", src);
  MOE_CHECK(dst.shape == src.shape, op, ": dst ", dst.shape.str(), " and src ", src.shape.str(), " differ in shape");
  if (dst.dtype == src.dtype) return cuda::copy(dst, src, stream);  // qualified: moe::copy is visible too
  check_float_type(op, "dst", dst);
  check_float_type(op, "src", src);
  const int64_t n = dst.numel();
  if (n == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (dst.dtype == DType::BF16)
    cast_f32_to_bf16_kernel<<<grid_for(n), kThreads, 0, s>>>(dst.ptr<__nv_bfloat16>(), src.ptr<const float>(), n);
  else
    cast_bf16_to_f32_kernel<<<grid_for(n), kThreads, 0, s>>>(dst.ptr<float>(), src.ptr<const __nv_bfloat16>(), n);
  CUDA_CHECK_LAUNCH();
}

void accumulate_scalars(Tensor stats, const std::vector<ScalarTerm>& terms, Stream stream) {
  check_scalar_terms("accumulate_scalars", stats, terms);
  const cudaStream_t s = cuda_stream(stream);
  for (size_t first = 0; first < terms.size(); first += kMaxScalarTerms) {
    ScalarTermBatch batch{};
    batch.count = static_cast<int>(std::min<size_t>(terms.size() - first, kMaxScalarTerms));
    for (int i = 0; i < batch.count; ++i) {
      const ScalarTerm& term = terms[first + i];
      const char* element =
          static_cast<const char*>(term.src.data) + static_cast<size_t>(term.index) * dtype_size(term.src.dtype);
      batch.terms[i] = {element, term.slot, term.scale, term.src.dtype == DType::I32 ? 1 : 0};
    }
    accumulate_scalars_kernel<<<1, 1, 0, s>>>(stats.ptr<float>(), batch);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace moe::cuda

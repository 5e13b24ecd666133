// CUDA embedding lookup/accumulation and element-wise helpers (see moe/ops/embedding.h and
// moe/ops/cuda/embedding.h for the dtype contract).
//
// Kernels:
//   embedding_forward_kernel   one thread per output element, grid-stride; copies T bits.
//   embedding_backward_kernel  one warp per (vocab partition p, column chunk): the warp owns the
//                              columns [32 kVec chunk, + 32 kVec) (kVec = 8 BF16 or 4 F32 in one
//                              16-byte dout access when D % kVec == 0 and the bases are 16-byte
//                              aligned; else 1) of every vocab row v with v % P == p (P a power
//                              of two). It scans all R token ids in order (ballot), queues its rows
//                              (row, token) in a shared-memory ring, and takes them kBatch at a time:
//                              the batch's dout loads are issued together, then added in row order
//                              into an FP32 register copy of dtable[token, its columns], written
//                              back when the token changes. Each dtable element has exactly one
//                              owner lane that adds its contributions in row order: no races, no
//                              atomics, and the same FP32 additions in the same order as the CPU op
//                              (bit-identical). P only spreads the work; it does not change the
//                              result.
//   add_inplace_kernel         one thread per element, grid-stride, sum in FP32.
//   cast_kernel                one thread per element, grid-stride.
//   accumulate_scalars_kernel  one thread applies up to kMaxScalarTerms terms, passed by value in
//                              the kernel's parameters, in order.
// fill_zero and copy (and cast_copy between equal dtypes) are cudaMemsetAsync/cudaMemcpyAsync.
// NOTES: every warp of embedding_backward reads all R token ids (32768 ids = 128 KB, shared in L1
// by the warps of a block); a skewed token distribution loads one partition more than the others,
// but a frequent token's rows mostly follow each other in its warp's queue, so they cost register
// additions, not a dtable round trip each. A token that changes costs one dtable read (no sort:
// sorting rows by token would need a workspace).
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
constexpr int kBackwardWarps = 8;  // warps per embedding_backward block
constexpr int64_t kBackwardTargetWarps = 3072;  // one wave: 3 blocks of 8 warps per SM fit 132 SMs (H200)
constexpr int kTokenLoads = 4;                  // 32-token loads per lane per scan step
constexpr int kScanStep = 32 * kTokenLoads;     // token ids per scan step
constexpr int kBatch = 4;                       // queued rows whose dout loads are in flight together
constexpr int kQueue = 256;                     // ring slots per warp: >= kBatch - 1 + kScanStep, a power of two
static_assert(kQueue >= kBatch - 1 + kScanStep && (kQueue & (kQueue - 1)) == 0, "the ring must hold a scan step");
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

// kVec consecutive elements widened to FP32: dout (T: Raw keeps the bits between the load and the
// add) and dtable (F32). kVec is 1 or one 16-byte access of T; dtable then takes kVec / 4 float4.
template <typename T, int kVec>
struct RowAccess;

template <typename T>
struct RowAccess<T, 1> {
  using Raw = T;
  static __device__ __forceinline__ Raw load(const T* p) { return *p; }
  static __device__ __forceinline__ void unpack(Raw raw, float (&v)[1]) { v[0] = to_f32(raw); }
};

template <>
struct RowAccess<float, 4> {
  using Raw = uint4;
  static __device__ __forceinline__ Raw load(const float* p) { return *reinterpret_cast<const uint4*>(p); }
  static __device__ __forceinline__ void unpack(Raw raw, float (&v)[4]) {
    v[0] = __uint_as_float(raw.x);
    v[1] = __uint_as_float(raw.y);
    v[2] = __uint_as_float(raw.z);
    v[3] = __uint_as_float(raw.w);
  }
};

// BF16 is the top half of an FP32: widening is a shift (as __bfloat162float); the element with the
// lower index is the low half of a little-endian word.
template <>
struct RowAccess<__nv_bfloat16, 8> {
  using Raw = uint4;
  static __device__ __forceinline__ Raw load(const __nv_bfloat16* p) { return *reinterpret_cast<const uint4*>(p); }
  static __device__ __forceinline__ void unpack(Raw raw, float (&v)[8]) {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(words[i] << 16);
      v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
};

template <int kVec>
__device__ __forceinline__ void load_f32(const float* p, float (&v)[kVec]) {
  if constexpr (kVec == 1) {
    v[0] = *p;
  } else {
#pragma unroll
    for (int q = 0; q < kVec / 4; ++q) {
      const float4 f = reinterpret_cast<const float4*>(p)[q];
      v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
    }
  }
}

template <int kVec>
__device__ __forceinline__ void store_f32(float* p, const float (&v)[kVec]) {
  if constexpr (kVec == 1) {
    *p = v[0];
  } else {
#pragma unroll
    for (int q = 0; q < kVec / 4; ++q)
      reinterpret_cast<float4*>(p)[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
  }
}

// Warp w of block b has task t = b kBackwardWarps + w: column chunk t % column_chunks, partition
// t / column_chunks. Lane l holds columns [chunk 32 kVec + l kVec, + kVec) (none when past D).
// The queue counters head and tail are the same in every lane; the ring's slot of entry i is i % kQueue.
template <typename T, int kVec>
__global__ void __launch_bounds__(32 * kBackwardWarps, 3)
    embedding_backward_kernel(float* dtable, const T* dout, const int32_t* tokens, int64_t R, int64_t D, int64_t V,
                              int64_t column_chunks, int64_t partitions) {
  using A = RowAccess<T, kVec>;
  __shared__ int32_t queue_row[kBackwardWarps][kQueue];
  __shared__ int32_t queue_token[kBackwardWarps][kQueue];
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kBackwardWarps + warp;
  if (task >= column_chunks * partitions) return;  // whole warps leave together
  const int64_t partition = task / column_chunks;
  const int64_t c = (task % column_chunks) * (32 * kVec) + lane * kVec;
  const bool has_columns = c < D;  // D % kVec == 0: the lane's kVec columns are all inside
  int32_t* rows = queue_row[warp];
  int32_t* row_tokens = queue_token[warp];
  uint32_t head = 0, tail = 0;
  int32_t current = -1;  // the token whose dtable columns acc holds
  float acc[kVec];

  // Adds the n (<= kBatch) queued rows at head into dtable, in queue (= row) order.
  auto add_rows = [&](uint32_t n) {
    typename A::Raw grad[kBatch];
    int32_t token[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (static_cast<uint32_t>(i) >= n) break;
      const uint32_t slot = (head + i) % kQueue;
      token[i] = row_tokens[slot];
      if (has_columns) grad[i] = A::load(dout + static_cast<int64_t>(rows[slot]) * D + c);
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (static_cast<uint32_t>(i) >= n) break;
      if (token[i] != current) {
        if (current >= 0 && has_columns) store_f32<kVec>(dtable + static_cast<int64_t>(current) * D + c, acc);
        current = token[i];
        if (has_columns) load_f32<kVec>(dtable + static_cast<int64_t>(current) * D + c, acc);
      }
      if (has_columns) {
        float g[kVec];
        A::unpack(grad[i], g);
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[j] += g[j];
      }
    }
    head += n;
  };

  auto load_tokens = [&](int64_t base, int32_t (&ids)[kTokenLoads]) {
#pragma unroll
    for (int k = 0; k < kTokenLoads; ++k) {
      const int64_t r = base + k * 32 + lane;
      ids[k] = r < R ? __ldg(tokens + r) : -1;
    }
  };
  int32_t next_ids[kTokenLoads];
  load_tokens(0, next_ids);
  for (int64_t base = 0; base < R; base += kScanStep) {
    int32_t ids[kTokenLoads];
#pragma unroll
    for (int k = 0; k < kTokenLoads; ++k) ids[k] = next_ids[k];
    load_tokens(base + kScanStep, next_ids);  // in flight while this step's rows are added
#pragma unroll
    for (int k = 0; k < kTokenLoads; ++k) {
      const int32_t id = ids[k];
      const bool mine = id >= 0 && id < V && (id & (partitions - 1)) == partition;
      const uint32_t mask = __ballot_sync(0xffffffffu, mine);
      if (mine) {
        const uint32_t slot = (tail + __popc(mask & ((1u << lane) - 1u))) % kQueue;
        rows[slot] = static_cast<int32_t>(base + k * 32 + lane);
        row_tokens[slot] = id;
      }
      tail += __popc(mask);
    }
    __syncwarp();  // the queue entries are visible to the whole warp
    while (tail - head >= kBatch) add_rows(kBatch);
    __syncwarp();  // every lane has read its entries before the next step overwrites the slots
  }
  while (tail != head) add_rows(min(tail - head, static_cast<uint32_t>(kBatch)));
  if (current >= 0 && has_columns) store_f32<kVec>(dtable + static_cast<int64_t>(current) * D + c, acc);
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

template <typename T, int kVec>
void launch_embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, int64_t R, int64_t D, int64_t V,
                               cudaStream_t s) {
  const int64_t column_chunks = (D + 32 * kVec - 1) / (32 * kVec);
  // P: a power of two (the partition is id & (P - 1)) near kBackwardTargetWarps / column_chunks,
  // and no larger than V needs.
  int64_t partitions = 1;
  while (partitions * 2 * column_chunks <= kBackwardTargetWarps && partitions < V) partitions *= 2;
  const int64_t tasks = column_chunks * partitions;
  const unsigned blocks = static_cast<unsigned>((tasks + kBackwardWarps - 1) / kBackwardWarps);
  embedding_backward_kernel<T, kVec><<<blocks, 32 * kBackwardWarps, 0, s>>>(
      dtable.ptr<float>(), dout.ptr<const T>(), tokens.ptr<const int32_t>(), R, D, V, column_chunks, partitions);
  CUDA_CHECK_LAUNCH();
}

// The 16-byte path needs every row of dout and dtable to start on 16 bytes: D a multiple of kVec
// and 16-byte aligned bases.
template <typename T>
void launch_embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, int64_t R, int64_t D, int64_t V,
                               cudaStream_t s) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  const bool vector_rows = D % kVec == 0 && reinterpret_cast<uintptr_t>(dout.data) % 16 == 0 &&
                           reinterpret_cast<uintptr_t>(dtable.data) % 16 == 0;
  if (vector_rows)
    launch_embedding_backward<T, kVec>(dtable, dout, tokens, R, D, V, s);
  else
    launch_embedding_backward<T, 1>(dtable, dout, tokens, R, D, V, s);
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
  MOE_CHECK(R <= INT32_MAX, op, ": ", R, " token rows; at most 2^31 - 1 (row indices are 32-bit)");
  const cudaStream_t s = cuda_stream(stream);
  if (dout.dtype == DType::F32)
    launch_embedding_backward<float>(dtable, dout, tokens, R, D, V, s);
  else
    launch_embedding_backward<__nv_bfloat16>(dtable, dout, tokens, R, D, V, s);
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

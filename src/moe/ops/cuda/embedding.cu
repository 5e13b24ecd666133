// CUDA embedding lookup and accumulation (see moe/ops/embedding.h and moe/ops/cuda/embedding.h
// for the dtype contract).
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
// NOTES: every warp of embedding_backward reads all R token ids (32768 ids = 128 KB, shared in L1
// by the warps of a block); a skewed token distribution loads one partition more than the others,
// but a frequent token's rows mostly follow each other in its warp's queue, so they cost register
// additions, not a dtable round trip each. A token that changes costs one dtable read (no sort:
// sorting rows by token would need a workspace).
#include "moe/ops/cuda/embedding.h"

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/element.cuh"

namespace moe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBackwardWarps = 8;  // warps per embedding_backward block
constexpr int64_t kBackwardTargetWarps = 3072;  // one wave: 3 blocks of 8 warps per SM fit 132 SMs (H200)
constexpr int kTokenLoads = 4;                  // 32-token loads per lane per scan step
constexpr int kScanStep = 32 * kTokenLoads;     // token ids per scan step
constexpr int kBatch = 4;                       // queued rows whose dout loads are in flight together
constexpr int kQueue = 256;                     // ring slots per warp: >= kBatch - 1 + kScanStep, a power of two
static_assert(kQueue >= kBatch - 1 + kScanStep && (kQueue & (kQueue - 1)) == 0, "the ring must hold a scan step");

template <typename T>
__global__ void __launch_bounds__(kThreads)
    embedding_forward_kernel(T* out, const T* table, const int32_t* tokens, int64_t R, int64_t D, int64_t V) {
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < R * D;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / D, c = idx % D;
    const int32_t tok = tokens[r];
    out[idx] = (tok >= 0 && tok < V) ? table[static_cast<int64_t>(tok) * D + c] : from_f32<T>(__int_as_float(0x7fc00000));
  }
}

// dtable's kVec FP32 elements (dout's go through VecAccess): kVec is 1 or one 16-byte access of
// dout's T, so dtable takes kVec / 4 float4.
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
  using A = VecAccess<T, kVec>;
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
  const int64_t R = out.dim(0), D = out.dim(1), V = table.dim(0);
  if (R * D == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (table.dtype == DType::F32)
    embedding_forward_kernel<float><<<grid_stride_blocks(R * D, kThreads), kThreads, 0, s>>>(out.ptr<float>(), table.ptr<const float>(),
                                                                         tokens.ptr<const int32_t>(), R, D, V);
  else
    embedding_forward_kernel<__nv_bfloat16><<<grid_stride_blocks(R * D, kThreads), kThreads, 0, s>>>(
        out.ptr<__nv_bfloat16>(), table.ptr<const __nv_bfloat16>(), tokens.ptr<const int32_t>(), R, D, V);
  CUDA_CHECK_LAUNCH();
}

void embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Stream stream) {
  const int64_t R = dout.dim(0), D = dout.dim(1), V = dtable.dim(0);
  if (R * D == 0 || V == 0) return;
  MOE_CHECK(R <= INT32_MAX, "embedding_backward: ", R,
            " token rows; at most 2^31 - 1 (the kernel's row indices are 32-bit)");
  const cudaStream_t s = cuda_stream(stream);
  if (dout.dtype == DType::F32)
    launch_embedding_backward<float>(dtable, dout, tokens, R, D, V, s);
  else
    launch_embedding_backward<__nv_bfloat16>(dtable, dout, tokens, R, D, V, s);
}

}  // namespace moe::cuda

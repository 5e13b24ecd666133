// CUDA LM head + cross-entropy: cuBLASLt products around one row-wise softmax kernel per chunk.
// The design (BF16 logit gradient in place, deterministic loss sum) is explained in
// moe/ops/cuda/loss.h.
#include "moe/ops/cuda/loss.h"

#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/gemm.h"

namespace moe::cuda {
namespace {

constexpr int kThreads = 512;     // per row
constexpr int kRowBlocks = 256;   // fixed grid: the loss partials do not depend on the GPU
constexpr int kStagedThreads = 1024;  // per row, for rows staged in shared memory
constexpr int kStagedStaticSmem = 1024;  // bytes kept back for the kernel's static shared memory
static_assert((kRowBlocks + 1) * sizeof(double) <= kStreamScratchBytes, "loss partials must fit the stream scratch");

// Block-wide max / sum with a fixed reduction tree (deterministic). Every thread gets the result;
// the trailing barrier lets the caller reuse `shared` at once.
__device__ float block_max(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  const float result = shared[0];
  __syncthreads();
  return result;
}

__device__ double block_sum(double v, double* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  const double result = shared[0];
  __syncthreads();
  return result;
}

// Rows [0, n) of logits [n, V] (F32): per-row loss into this block's partial, and with want_grad
// the row replaced by G = grad_scale * (softmax - onehot) (0 for ignored rows), F32 in place or,
// with kBf16Grad, BF16 in the first half of the row (leading dim 2V in BF16 elements).
template <bool kBf16Grad>
__global__ void __launch_bounds__(kThreads)
    softmax_cross_entropy_rows(float* __restrict__ logits, int64_t n, int64_t V, const int32_t* __restrict__ targets,
                               float grad_scale, bool want_grad, double* __restrict__ partials) {
  __shared__ float max_shared[32];
  __shared__ double sum_shared[32];
  const int tid = threadIdx.x;
  double block_loss = 0.0;  // meaningful in thread 0
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    float* row = logits + i * V;
    const int32_t t = targets[i];
    const bool valid = t >= 0 && t < V;  // uniform across the block: the branches below may hold barriers
    float max_logit = 0.0f, scale = 0.0f;
    double row_loss = t == -1 ? 0.0 : NAN;  // ignored row: no loss; out-of-range target: NaN
    if (valid) {
      const float target_logit = row[t];  // read before any thread writes the row
      float m = -INFINITY;
      for (int64_t j = tid; j < V; j += kThreads) m = fmaxf(m, row[j]);
      max_logit = block_max(m, max_shared);
      double s = 0.0;  // exponentials in FP32, their sum in FP64 (as on the CPU)
      for (int64_t j = tid; j < V; j += kThreads) s += static_cast<double>(expf(row[j] - max_logit));
      const double sum_exp = block_sum(s, sum_shared);
      row_loss = static_cast<double>(max_logit) + log(sum_exp) - static_cast<double>(target_logit);
      scale = static_cast<float>(grad_scale / sum_exp);
    }
    if (want_grad) {
      if constexpr (kBf16Grad) {
        __nv_bfloat16* grad_row = reinterpret_cast<__nv_bfloat16*>(row);
        for (int64_t s0 = 0; s0 < V; s0 += kThreads) {
          const int64_t j = s0 + tid;
          float g = 0.0f;
          if (valid && j < V) {
            g = scale * expf(row[j] - max_logit);
            if (j == t) g -= grad_scale;
          }
          // All of strip [s0, s0 + kThreads) is read; its BF16 values land on F32 elements
          // [s0 / 2, (s0 + kThreads) / 2), all below the strip's end, so nothing unread is overwritten.
          __syncthreads();
          if (j < V) grad_row[j] = __float2bfloat16(g);
        }
      } else {
        for (int64_t j = tid; j < V; j += kThreads) {
          float g = 0.0f;
          if (valid) {
            g = scale * expf(row[j] - max_logit);
            if (j == t) g -= grad_scale;
          }
          row[j] = g;
        }
      }
    }
    if (tid == 0) block_loss += row_loss;
    __syncthreads();
  }
  if (tid == 0) partials[blockIdx.x] = block_loss;
}

// Rows whose F32 logits fit in shared memory (see staged_rows_fit): the block copies the row
// there with one read of global memory (16-byte words by cp.async, all of a thread's in flight at
// once); the max and the exponential sum then read the copy, the sum pass leaves each word's
// exponentials in its place, and the gradient scales them and goes straight to global memory (BF16
// into the first half of the row, or F32 in place) with no strip barriers: every global read of
// the row precedes block_max's barriers, every write follows them. Every pass gives thread `tid`
// the same words (w = tid, tid + kStagedThreads, ...), so a thread reads back only what it wrote
// and the passes need no barriers of their own. Same results as softmax_cross_entropy_rows but for
// the summation order of the FP64 exponential sum.
//
// NOTES: the first staged form loaded each word with a plain load followed by its shared-memory
// store (one load in flight per thread) and took the exponential twice (sum and gradient): 0.65 ms
// per 4681-row chunk of bench-olmoe-4l, ~18 us per row and SM (bench/RESULTS.md, fourteenth session).
template <bool kBf16Grad>
__global__ void __launch_bounds__(kStagedThreads)
    softmax_cross_entropy_rows_staged(float* __restrict__ logits, int64_t n, int64_t V,
                                      const int32_t* __restrict__ targets, float grad_scale, bool want_grad,
                                      double* __restrict__ partials) {
  extern __shared__ float4 staged[];
  __shared__ float max_shared[32];
  __shared__ double sum_shared[32];
  const int tid = threadIdx.x;
  const int64_t words = V / 4;
  double block_loss = 0.0;  // meaningful in thread 0
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    float* row = logits + i * V;
    const int32_t t = targets[i];
    const bool valid = t >= 0 && t < V;  // uniform across the block: the branches below may hold barriers
    // Thread 0 keeps the target's logit (the sum pass overwrites the staged copy with exponentials).
    const float target_logit = tid == 0 && valid ? row[t] : 0.0f;
    // Each copy overwrites words this thread alone read in the previous row's gradient pass (their
    // values went into its global stores first), so no barrier stands before it.
    for (int64_t w = tid; w < words; w += kStagedThreads)
      __pipeline_memcpy_async(staged + w, reinterpret_cast<const float4*>(row) + w, sizeof(float4));
    __pipeline_commit();
    __pipeline_wait_prior(0);
    float m = -INFINITY;
    for (int64_t w = tid; w < words; w += kStagedThreads) {
      const float4 x = staged[w];
      m = fmaxf(fmaxf(m, fmaxf(x.x, x.y)), fmaxf(x.z, x.w));
    }
    const float max_logit = block_max(m, max_shared);  // its barriers also order every read of the row
    float scale = 0.0f;
    double row_loss = t == -1 ? 0.0 : NAN;  // ignored row: no loss; out-of-range target: NaN
    if (valid) {
      double sum = 0.0;  // exponentials in FP32, their sum in FP64 (as on the CPU)
      for (int64_t w = tid; w < words; w += kStagedThreads) {
        const float4 x = staged[w];
        const float4 e = make_float4(expf(x.x - max_logit), expf(x.y - max_logit), expf(x.z - max_logit),
                                     expf(x.w - max_logit));
        sum += static_cast<double>(e.x);
        sum += static_cast<double>(e.y);
        sum += static_cast<double>(e.z);
        sum += static_cast<double>(e.w);
        staged[w] = e;
      }
      const double sum_exp = block_sum(sum, sum_shared);
      row_loss = static_cast<double>(max_logit) + log(sum_exp) - static_cast<double>(target_logit);
      scale = static_cast<float>(grad_scale / sum_exp);
    }
    if (want_grad) {
      for (int64_t w = tid; w < words; w += kStagedThreads) {
        const float4 e = staged[w];
        const float es[4] = {e.x, e.y, e.z, e.w};
        float g[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          g[k] = 0.0f;
          if (valid) {
            g[k] = scale * es[k];
            if (4 * w + k == t) g[k] -= grad_scale;
          }
        }
        if constexpr (kBf16Grad) {
          const __nv_bfloat162 lo = __floats2bfloat162_rn(g[0], g[1]), hi = __floats2bfloat162_rn(g[2], g[3]);
          uint2 packed;
          packed.x = *reinterpret_cast<const uint32_t*>(&lo);
          packed.y = *reinterpret_cast<const uint32_t*>(&hi);
          reinterpret_cast<uint2*>(row)[w] = packed;  // BF16 elements 4w..4w+3 of the row's first half
        } else {
          reinterpret_cast<float4*>(row)[w] = make_float4(g[0], g[1], g[2], g[3]);
        }
      }
    }
    if (tid == 0) block_loss += row_loss;
  }
  if (tid == 0) partials[blockIdx.x] = block_loss;
}

// Whether rows of V F32 logits at `base` take the staged kernel: V a multiple of 4 (16-byte rows),
// base 16-byte aligned, and the row within the GPU's opt-in shared memory per block. The first call
// raises both instantiations' dynamic shared-memory limit (host only, no stream work).
bool staged_rows_fit(int64_t V, const void* base) {
  static const int64_t limit = [] {
    int device = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    const int dynamic = optin - kStagedStaticSmem;
    CUDA_CHECK(cudaFuncSetAttribute(softmax_cross_entropy_rows_staged<true>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic));
    CUDA_CHECK(cudaFuncSetAttribute(softmax_cross_entropy_rows_staged<false>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic));
    return static_cast<int64_t>(dynamic);
  }();
  return V % 4 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0 && V * static_cast<int64_t>(sizeof(float)) <= limit;
}

// One thread: total (= on the first chunk, += after) the chunk's partials in block order; after
// the last chunk loss_sum = total rounded to F32.
__global__ void accumulate_chunk_loss(const double* __restrict__ partials, int count, double* __restrict__ total,
                                      bool first, bool last, float* __restrict__ loss_sum) {
  double sum = first ? 0.0 : *total;
  for (int b = 0; b < count; ++b) sum += partials[b];
  *total = sum;
  if (last) *loss_sum = static_cast<float>(sum);
}

}  // namespace

void lm_head_cross_entropy(Tensor loss_sum, Tensor dh, Tensor dweight, Tensor h, Tensor weight, Tensor targets,
                           float grad_scale, Tensor workspace, Stream stream) {
  const DType T = h.dtype;
  const int64_t R = h.dim(0), D = h.dim(1), V = weight.dim(0);
  const bool want_dh = !dh.empty(), want_dw = !dweight.empty();
  const cudaStream_t s = cuda_stream(stream);
  if (R == 0) {
    CUDA_CHECK(cudaMemsetAsync(loss_sum.data, 0, sizeof(float), s));  // 0.0f is all zero bits
    return;
  }
  const bool want_grad = want_dh || want_dw;
  const bool bf16_grad = T == DType::BF16;
  const size_t elem = dtype_size(T);
  double* partials = static_cast<double*>(stream_workspace(stream).scratch);
  double* total = partials + kRowBlocks;
  const int64_t chunk = workspace.dim(0);
  const int64_t ld_d = D > 0 ? D : 1;  // leading dims must be >= 1 even for empty rows
  const MatrixView w{weight.data, T, V, D, ld_d};
  const bool staged = staged_rows_fit(V, workspace.data);
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    const int64_t n = R - r0 < chunk ? R - r0 : chunk;
    const MatrixView logits{workspace.data, DType::F32, n, V, V};
    const MatrixView h_chunk{static_cast<char*>(h.data) + r0 * D * elem, T, n, D, ld_d};
    matmul_view(logits, h_chunk, w, false, true, 1.0f, 0.0f, stream);  // D = 0: zeros, as on the CPU

    const int blocks = static_cast<int>(n < kRowBlocks ? n : kRowBlocks);
    const int32_t* chunk_targets = static_cast<const int32_t*>(targets.data) + r0;
    if (staged) {
      const size_t smem = static_cast<size_t>(V) * sizeof(float);
      if (bf16_grad)
        softmax_cross_entropy_rows_staged<true><<<blocks, kStagedThreads, smem, s>>>(
            workspace.f32(), n, V, chunk_targets, grad_scale, want_grad, partials);
      else
        softmax_cross_entropy_rows_staged<false><<<blocks, kStagedThreads, smem, s>>>(
            workspace.f32(), n, V, chunk_targets, grad_scale, want_grad, partials);
    } else if (bf16_grad) {
      softmax_cross_entropy_rows<true><<<blocks, kThreads, 0, s>>>(workspace.f32(), n, V, chunk_targets, grad_scale,
                                                                    want_grad, partials);
    } else {
      softmax_cross_entropy_rows<false><<<blocks, kThreads, 0, s>>>(workspace.f32(), n, V, chunk_targets, grad_scale,
                                                                     want_grad, partials);
    }
    CUDA_CHECK_LAUNCH();
    accumulate_chunk_loss<<<1, 1, 0, s>>>(partials, blocks, total, r0 == 0, r0 + n >= R, loss_sum.f32());
    CUDA_CHECK_LAUNCH();

    if (!want_grad || D == 0) continue;
    // G [n, V]: F32 in place (leading dim V) or BF16 in the first half of each F32 row (leading dim 2V).
    const MatrixView grad = bf16_grad ? MatrixView{workspace.data, DType::BF16, n, V, 2 * V}
                                      : MatrixView{workspace.data, DType::F32, n, V, V};
    if (want_dh) {  // dh[r0:r0+n] = G W
      const MatrixView dh_chunk{static_cast<char*>(dh.data) + r0 * D * dtype_size(dh.dtype), dh.dtype, n, D, D};
      matmul_view(dh_chunk, grad, w, false, false, 1.0f, 0.0f, stream);
    }
    if (want_dw) {  // dweight += G^T h[r0:r0+n]
      const MatrixView dw{dweight.data, dweight.dtype, V, D, D};
      matmul_view(dw, grad, h_chunk, true, false, 1.0f, 1.0f, stream);
    }
  }
}

}  // namespace moe::cuda

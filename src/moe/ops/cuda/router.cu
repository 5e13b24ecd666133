// CUDA router. Per-token work (scores, top-K, weights, gradient) runs one warp per token with the
// token's N <= 256 scores held 8 per lane in registers; reductions over tokens (the losses) run
// in two kernels whose sums follow a fixed order. No float atomics anywhere: results are
// bit-identical from run to run. synthetic_routing runs one thread per token and draws the same
// numbers as the CPU's Rng (mix64/hash_counters are shared with the host), so it equals the CPU op.
//
// NOTES: exponentials are computed as (float)exp((double)x), which rounds like the CPU's expf in
// all but vanishingly rare cases, so scores (and hence the top-K order) agree with the CPU
// bit for bit almost always; the remaining differences are sum orders (warp trees here,
// serial loops on the CPU) in double precision.
#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <limits>

#include "moe/core/cuda_check.h"
#include "moe/core/rng.h"
#include "moe/ops/cuda/router.h"

namespace moe::cuda {

namespace {

constexpr int kWarp = 32;
constexpr int kMaxExperts = 256;
constexpr int kExpertsPerLane = kMaxExperts / kWarp;  // register slots per lane
constexpr int kThreads = 256;                         // 8 warps per block: 8 tokens
constexpr int kWarpsPerBlock = kThreads / kWarp;
constexpr unsigned kFullMask = 0xffffffffu;

// router_losses: tokens are split over at most this many blocks, each writing its partial sums to
// the caller's workspace; a second one-block kernel adds the partials in block order.
constexpr int kLossBlocks = 128;

// synthetic_routing: one thread per token, grid-stride over at most this many blocks.
constexpr int64_t kMaxTokenBlocks = 1 << 16;
// The increment of Rng::next_u64 (moe/core/rng.h): the kernel replays Rng's draws.
constexpr uint64_t kRngIncrement = 0x9e3779b97f4a7c15ull;

// The split of router_losses' tokens: a fixed function of T, so the sum order (and the result)
// depends on T only. Each block writes N score partials and one z partial (FP64) to the workspace.
struct LossSplit {
  int64_t chunk = 0;  // tokens per block
  int blocks = 0;
};

LossSplit loss_split(int64_t T) {
  LossSplit split;
  if (T == 0) return split;
  split.chunk = (T + kLossBlocks - 1) / kLossBlocks;
  split.blocks = static_cast<int>((T + split.chunk - 1) / split.chunk);
  return split;
}

// The one limit of these kernels (ops/router.cpp checks the rest of the call).
void check_experts(int64_t N, const char* op) {
  MOE_CHECK(N >= 1 && N <= kMaxExperts, op, ": N = ", N, " experts; the CUDA router supports 1 to ", kMaxExperts);
}


__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Butterfly sum: every lane ends with the same, order-fixed value.
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Sum over the block in a fixed order (warp trees, then warps in index order); all threads get it.
// Every thread of the block must call it.
__device__ double block_sum(double v) {
  __shared__ double warp_totals[kWarpsPerBlock];
  v = warp_sum(v);
  if (threadIdx.x % kWarp == 0) warp_totals[threadIdx.x / kWarp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarpsPerBlock; ++w) total += warp_totals[w];
  __syncthreads();  // warp_totals may be reused by the next call
  return total;
}

// (float)exp(x) rounded from double: matches the CPU's expf in all but vanishingly rare cases.
__device__ __forceinline__ float exp_f32(float x) { return static_cast<float>(exp(static_cast<double>(x))); }

// max_e l[e] of one token's values over its N experts, held as in router_forward (slot j = expert
// lane + 32 j); every lane gets it.
__device__ __forceinline__ float token_max(const float (&l)[kExpertsPerLane], int lane, int N) {
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < kExpertsPerLane; ++j)
    if (lane + j * kWarp < N) mx = fmaxf(mx, l[j]);
  return warp_max(mx);
}

// log(sum_e exp(l[e])) of one token's logits, held as in router_forward (slot j = expert lane + 32 j).
// Same formula as the CPU: float max, double sum of exp(l - max), max + log(sum).
__device__ double warp_logsumexp(const float (&l)[kExpertsPerLane], int lane, int N) {
  const float mx = token_max(l, lane, N);
  double sum = 0.0;
#pragma unroll
  for (int j = 0; j < kExpertsPerLane; ++j)
    if (lane + j * kWarp < N) sum += exp(static_cast<double>(l[j]) - mx);
  sum = warp_sum(sum);
  return mx + log(sum);
}

// One warp per token: scores, then K passes of a warp argmax over the not-yet-taken experts.
__global__ void router_forward_kernel(float* __restrict__ scores, int32_t* __restrict__ topk_idx,
                                      float* __restrict__ topk_weight, const float* __restrict__ logits,
                                      const float* __restrict__ bias, int64_t T, int N, int K, bool softmax,
                                      bool normalize) {
  const int lane = threadIdx.x % kWarp;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (t >= T) return;  // the whole warp leaves together
  const float* l = logits + t * N;

  float s[kExpertsPerLane];  // slot j: expert lane + 32 j
#pragma unroll
  for (int j = 0; j < kExpertsPerLane; ++j) {
    const int e = lane + j * kWarp;
    s[j] = e < N ? l[e] : -INFINITY;
  }
  if (softmax) {
    const float mx = token_max(s, lane, N);
    double sum = 0.0;
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j)
      if (lane + j * kWarp < N) {
        s[j] = exp_f32(s[j] - mx);
        sum += s[j];
      }
    sum = warp_sum(sum);
    const float inv = static_cast<float>(1.0 / sum);
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j) s[j] *= inv;
  } else {
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j) s[j] = 1.0f / (1.0f + exp_f32(-s[j]));
  }

  float key[kExpertsPerLane];  // selection key: score plus the selection-only bias
  uint32_t taken = 0;          // bit j: slot j is already selected or is not an expert (e >= N)
#pragma unroll
  for (int j = 0; j < kExpertsPerLane; ++j) {
    const int e = lane + j * kWarp;
    if (e < N) {
      scores[t * N + e] = s[j];
      key[j] = bias != nullptr ? s[j] + bias[e] : s[j];
      // NOTES: a NaN key is selected as if it were -inf (after every finite key, lower index first),
      // so the K selected experts are always distinct.
      if (isnan(key[j])) key[j] = -INFINITY;
    } else {
      key[j] = -INFINITY;
      taken |= 1u << j;
    }
  }

  int32_t* idx = topk_idx + t * K;
  float* w = topk_weight + t * K;
  float sum = 0.0f;  // in k order, in FP32, as on the CPU
  for (int k = 0; k < K; ++k) {
    // Best untaken (key descending, expert ascending) of this lane, then over the warp.
    float best_key = -INFINITY, best_score = 0.0f;
    int best = INT_MAX;
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j) {
      const int e = lane + j * kWarp;
      if (!((taken >> j) & 1u) && (key[j] > best_key || (key[j] == best_key && e < best))) {
        best_key = key[j];
        best = e;
        best_score = s[j];
      }
    }
    for (int o = kWarp / 2; o > 0; o >>= 1) {
      const float other_key = __shfl_xor_sync(kFullMask, best_key, o);
      const int other = __shfl_xor_sync(kFullMask, best, o);
      const float other_score = __shfl_xor_sync(kFullMask, best_score, o);
      if (other_key > best_key || (other_key == best_key && other < best)) {
        best_key = other_key;
        best = other;
        best_score = other_score;
      }
    }
    // K <= N guarantees an untaken expert, so best < N here.
    if (best % kWarp == lane) taken |= 1u << (best / kWarp);
    if (k % kWarp == lane) {
      idx[k] = best;
      w[k] = best_score;
    }
    sum += best_score;
  }
  // NOTES: a zero sum (every selected sigmoid underflowed) leaves the weights unnormalized, as on the CPU.
  if (normalize && sum > 0.0f)
    for (int k = lane; k < K; k += kWarp) w[k] /= sum;  // this lane wrote w[k] above
}

// Block b sums tokens [b * chunk, min(T, (b + 1) * chunk)): per-expert score sums (one thread per
// expert column, tokens in order) into score_partials[b][e] and lse^2 (one warp per token, warps'
// sums added in order) into z_partials[b].
__global__ void router_losses_partials_kernel(double* __restrict__ score_partials, double* __restrict__ z_partials,
                                              const float* __restrict__ scores, const float* __restrict__ logits,
                                              int64_t T, int N, int64_t chunk) {
  const int64_t begin = blockIdx.x * chunk;
  const int64_t end = begin + chunk < T ? begin + chunk : T;
  for (int e = threadIdx.x; e < N; e += kThreads) {
    double sum = 0.0;
    for (int64_t t = begin; t < end; ++t) sum += scores[t * N + e];
    score_partials[static_cast<int64_t>(blockIdx.x) * N + e] = sum;
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  double z = 0.0;  // same value in every lane of the warp
  for (int64_t t = begin + warp; t < end; t += kWarpsPerBlock) {
    float l[kExpertsPerLane];
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j) {
      const int e = lane + j * kWarp;
      l[j] = e < N ? logits[t * N + e] : -INFINITY;
    }
    const double lse = warp_logsumexp(l, lane, N);
    z += lse * lse;
  }
  __shared__ double warp_z[kWarpsPerBlock];
  if (lane == 0) warp_z[warp] = z;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kWarpsPerBlock; ++w) total += warp_z[w];
    z_partials[blockIdx.x] = total;
  }
}

// One block: adds the partials of `blocks` blocks in block order and writes both losses.
__global__ void router_losses_final_kernel(float* __restrict__ lb_loss, float* __restrict__ z_loss,
                                           const double* __restrict__ score_partials,
                                           const double* __restrict__ z_partials,
                                           const int32_t* __restrict__ expert_counts, int64_t T, int N, int top_k,
                                           int blocks) {
  double lb = 0.0;
  for (int e = threadIdx.x; e < N; e += kThreads) {
    double score_sum = 0.0;
    for (int b = 0; b < blocks; ++b) score_sum += score_partials[static_cast<int64_t>(b) * N + e];
    lb += (static_cast<double>(expert_counts[e]) / T) * (score_sum / T);
  }
  lb = block_sum(lb);
  if (threadIdx.x == 0) {
    double z = 0.0;
    for (int b = 0; b < blocks; ++b) z += z_partials[b];
    lb_loss[0] = static_cast<float>(lb * (static_cast<double>(N) / top_k));
    z_loss[0] = static_cast<float>(z / T);
  }
}

// One warp per token; the token's dscores row is built in shared memory because the top-K terms
// land on arbitrary experts.
__global__ void router_backward_kernel(float* __restrict__ dlogits, const float* __restrict__ dtopk_weight,
                                       const int32_t* __restrict__ topk_idx, const float* __restrict__ topk_weight,
                                       const float* __restrict__ scores, const float* __restrict__ logits,
                                       const int32_t* __restrict__ expert_counts, int64_t T, int N, int K,
                                       double lb_coef, double z_coef, bool use_z, bool softmax, bool normalize) {
  __shared__ float dscores_rows[kWarpsPerBlock][kMaxExperts];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= T) return;  // the whole warp leaves together; no block-wide barrier follows
  float* ds = dscores_rows[warp];
  const float* s_row = scores + t * N;

  // d lb / d scores[t,e] = lb_scale * (N/K) * (count_e/T) / T: the same for every token.
  for (int e = lane; e < N; e += kWarp) ds[e] = static_cast<float>(lb_coef * expert_counts[e]);
  __syncwarp();
  if (lane == 0) {  // the K selected terms, serially in k order exactly as on the CPU
    const int32_t* idx = topk_idx + t * K;
    const float* dw = dtopk_weight + t * K;
    if (normalize) {
      // w_k = s_k / S  =>  ds_k = (dw_k - sum_j dw_j w_j) / S.
      const float* w = topk_weight + t * K;
      double sel_sum = 0.0, dot = 0.0;
      for (int k = 0; k < K; ++k) {
        if (idx[k] < 0 || idx[k] >= N) continue;  // not an expert: skipped (not checked on the GPU)
        sel_sum += s_row[idx[k]];
        dot += static_cast<double>(dw[k]) * w[k];
      }
      if (sel_sum > 0.0)
        for (int k = 0; k < K; ++k)
          if (idx[k] >= 0 && idx[k] < N) ds[idx[k]] += static_cast<float>((dw[k] - dot) / sel_sum);
    } else {
      for (int k = 0; k < K; ++k)
        if (idx[k] >= 0 && idx[k] < N) ds[idx[k]] += dw[k];
    }
  }
  __syncwarp();

  float d[kExpertsPerLane], s[kExpertsPerLane], l[kExpertsPerLane];
#pragma unroll
  for (int j = 0; j < kExpertsPerLane; ++j) {
    const int e = lane + j * kWarp;
    d[j] = e < N ? ds[e] : 0.0f;
    s[j] = e < N ? s_row[e] : 0.0f;
    l[j] = e < N ? logits[t * N + e] : -INFINITY;
  }
  // Through the score function.
  if (softmax) {
    double dot = 0.0;
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j) dot += static_cast<double>(d[j]) * s[j];
    dot = warp_sum(dot);
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j) d[j] = s[j] * static_cast<float>(d[j] - dot);
  } else {
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j) d[j] = d[j] * s[j] * (1.0f - s[j]);
  }
  // z-loss: d/dlogits of z_scale * mean_t lse_t^2, through softmax(logits) whatever the score function.
  if (use_z) {
    const double lse = warp_logsumexp(l, lane, N);
    const double coef = z_coef * lse;
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; ++j)
      if (lane + j * kWarp < N) d[j] += static_cast<float>(coef * exp(static_cast<double>(l[j]) - lse));
  }
#pragma unroll
  for (int j = 0; j < kExpertsPerLane; ++j) {
    const int e = lane + j * kWarp;
    if (e < N) dlogits[t * N + e] = d[j];
  }
}

// Thread t writes token t's K experts and weights. Random: the draws of Rng(hash_counters(seed,
// layer, t)).below(N) on the host, i.e. state = hash_counters(hash_counters(seed, layer, t), 0), then
// state += increment, value = mix64(state) % N per draw; a repeat of an expert already in the row is
// drawn again, as on the CPU.
__global__ void __launch_bounds__(kThreads)
    synthetic_routing_kernel(int32_t* __restrict__ topk_idx, float* __restrict__ topk_weight, int64_t T, int K,
                             int64_t N, bool random, uint64_t seed, uint64_t layer) {
  const float weight = 1.0f / static_cast<float>(K);
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; t < T;
       t += static_cast<int64_t>(gridDim.x) * kThreads) {
    int32_t* row = topk_idx + t * K;
    if (!random) {
      for (int k = 0; k < K; ++k) row[k] = static_cast<int32_t>((t * K + k) % N);
    } else {
      uint64_t state = hash_counters(hash_counters(seed, layer, static_cast<uint64_t>(t)));  // Rng(.., stream 0)
      for (int k = 0; k < K; ++k) {
        int32_t e;
        bool repeat;
        do {
          state += kRngIncrement;
          e = static_cast<int32_t>(mix64(state) % static_cast<uint64_t>(N));
          repeat = false;
          for (int j = 0; j < k && !repeat; ++j) repeat = row[j] == e;
        } while (repeat);
        row[k] = e;
      }
    }
    for (int k = 0; k < K; ++k) topk_weight[t * K + k] = weight;
  }
}

int token_blocks(int64_t T) { return static_cast<int>((T + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

void router_forward(Tensor scores, Tensor topk_idx, Tensor topk_weight, Tensor logits, Tensor bias, ScoreFn fn,
                    bool normalize, Stream stream) {
  const int64_t T = logits.dim(0), N = logits.dim(1), K = topk_idx.dim(1);
  check_experts(N, "router_forward");
  const bool has_bias = !bias.empty();
  if (T == 0) return;
  router_forward_kernel<<<token_blocks(T), kThreads, 0, cuda_stream(stream)>>>(
      scores.f32(), topk_idx.i32(), topk_weight.f32(), logits.f32(), has_bias ? bias.f32() : nullptr, T,
      static_cast<int>(N), static_cast<int>(K), fn == ScoreFn::Softmax, normalize);
  CUDA_CHECK_LAUNCH();
}

void synthetic_routing(Tensor topk_idx, Tensor topk_weight, bool random, int64_t num_experts, uint64_t seed,
                       int64_t layer, Stream stream) {
  const int64_t T = topk_idx.dim(0), K = topk_idx.dim(1), N = num_experts;
  if (T == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((T + kThreads - 1) / kThreads, kMaxTokenBlocks));
  synthetic_routing_kernel<<<blocks, kThreads, 0, cuda_stream(stream)>>>(
      topk_idx.i32(), topk_weight.f32(), T, static_cast<int>(K), N, random, seed, static_cast<uint64_t>(layer));
  CUDA_CHECK_LAUNCH();
}

int64_t router_losses_workspace_elems(int64_t tokens, int64_t experts) {
  // FP64 partials: blocks x (N score sums + 1 z sum), two F32 elements each.
  return 2 * loss_split(tokens).blocks * (experts + 1);
}

void router_losses(Tensor lb_loss, Tensor z_loss, Tensor expert_counts, Tensor scores, Tensor logits, int top_k,
                   Tensor workspace, Stream stream) {
  constexpr const char* op = "router_losses";
  const int64_t T = logits.dim(0), N = logits.dim(1);
  check_experts(N, op);
  MOE_CHECK(reinterpret_cast<uintptr_t>(workspace.data) % alignof(double) == 0, op,
            ": workspace must be 8-byte aligned (it holds FP64 partial sums)");
  const LossSplit split = loss_split(T);
  double* score_partials = workspace.ptr<double>();                // [blocks][N]
  double* z_partials = score_partials + static_cast<int64_t>(split.blocks) * N;  // [blocks]
  const cudaStream_t s = cuda_stream(stream);
  router_losses_partials_kernel<<<split.blocks, kThreads, 0, s>>>(score_partials, z_partials, scores.f32(),
                                                                 logits.f32(), T, static_cast<int>(N), split.chunk);
  CUDA_CHECK_LAUNCH();
  router_losses_final_kernel<<<1, kThreads, 0, s>>>(lb_loss.f32(), z_loss.f32(), score_partials, z_partials,
                                                    expert_counts.i32(), T, static_cast<int>(N), top_k, split.blocks);
  CUDA_CHECK_LAUNCH();
}

void router_backward(Tensor dlogits, Tensor dtopk_weight, Tensor topk_idx, Tensor topk_weight, Tensor scores,
                     Tensor logits, Tensor expert_counts, float lb_scale, float z_scale, ScoreFn fn, bool normalize,
                     Stream stream) {
  const int64_t T = logits.dim(0), N = logits.dim(1), K = topk_idx.dim(1);
  check_experts(N, "router_backward");
  if (T == 0) return;

  const double lb_coef = static_cast<double>(lb_scale) * static_cast<double>(N) / K / (static_cast<double>(T) * T);
  const double z_coef = 2.0 * static_cast<double>(z_scale) / T;
  router_backward_kernel<<<token_blocks(T), kThreads, 0, cuda_stream(stream)>>>(
      dlogits.f32(), dtopk_weight.f32(), topk_idx.i32(), topk_weight.f32(), scores.f32(), logits.f32(),
      expert_counts.i32(), T, static_cast<int>(N), static_cast<int>(K), lb_coef, z_coef, z_scale != 0.0f,
      fn == ScoreFn::Softmax, normalize);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda

// CPU router. Rows (tokens) are independent, so the per-row work runs under OpenMP; every
// reduction over tokens runs in a fixed order so results do not depend on the thread count.
#include "moe/ops/cpu/router.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "moe/core/rng.h"

namespace moe::cpu {

namespace {

// Below this many elements of work a loop runs on the calling thread: waking the OpenMP team
// costs more than the loop.
constexpr int64_t kMinParallelWork = 1 << 15;

// Stable log(sum(exp(row))) in double.
double logsumexp(const float* row, int64_t n) {
  float max_logit = row[0];
  for (int64_t e = 1; e < n; ++e) max_logit = std::fmax(max_logit, row[e]);
  double sum = 0.0;
  for (int64_t e = 0; e < n; ++e) sum += std::exp(static_cast<double>(row[e]) - max_logit);
  return max_logit + std::log(sum);
}

// {T, N, K} of a call with logits [T, N] and topk_idx [T, K].
std::array<int64_t, 3> dims(const Tensor& logits, const Tensor& topk_idx) {
  return {logits.dim(0), logits.dim(1), topk_idx.dim(1)};
}

}  // namespace

void router_forward(Tensor scores, Tensor topk_idx, Tensor topk_weight, Tensor logits, Tensor bias, ScoreFn fn,
                    bool normalize, Stream /*stream*/) {
  const auto [T, N, K] = dims(logits, topk_idx);
  const bool has_bias = !bias.empty();

  const float* L = logits.f32();
  const float* B = has_bias ? bias.f32() : nullptr;
  float* S = scores.f32();
  int32_t* I = topk_idx.i32();
  float* W = topk_weight.f32();

#pragma omp parallel if (T * N >= kMinParallelWork)
  {
    std::vector<float> keys(static_cast<size_t>(K));  // selection keys of the current top-K, descending
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* l = L + t * N;
      float* s = S + t * N;
      if (fn == ScoreFn::Softmax) {
        float max_logit = l[0];
        for (int64_t e = 1; e < N; ++e) max_logit = std::fmax(max_logit, l[e]);
        double sum = 0.0;
        for (int64_t e = 0; e < N; ++e) {
          s[e] = std::exp(l[e] - max_logit);
          sum += s[e];
        }
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t e = 0; e < N; ++e) s[e] *= inv;
      } else {
        for (int64_t e = 0; e < N; ++e) s[e] = 1.0f / (1.0f + std::exp(-l[e]));
      }

      // Top-K by insertion into a descending list. Experts are visited in ascending order and an
      // expert only moves ahead of strictly smaller keys, so ties go to the lower expert index.
      int32_t* idx = I + t * K;
      int64_t filled = 0;
      for (int64_t e = 0; e < N; ++e) {
        const float key = has_bias ? s[e] + B[e] : s[e];
        if (filled == K && !(key > keys[K - 1])) continue;
        int64_t pos = filled < K ? filled++ : K - 1;
        while (pos > 0 && key > keys[pos - 1]) {
          keys[pos] = keys[pos - 1];
          idx[pos] = idx[pos - 1];
          --pos;
        }
        keys[pos] = key;
        idx[pos] = static_cast<int32_t>(e);
      }

      float* w = W + t * K;
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        w[k] = s[idx[k]];
        sum += w[k];
      }
      // NOTES: a zero sum (every selected sigmoid underflowed) leaves the weights at zero rather than NaN.
      if (normalize && sum > 0.0f)
        for (int64_t k = 0; k < K; ++k) w[k] /= sum;
    }
  }
}

// Tokens are independent (each random token has its own generator), so they run under OpenMP
// with the same result for any thread count.
void synthetic_routing(Tensor topk_idx, Tensor topk_weight, bool random, int64_t num_experts, uint64_t seed,
                       int64_t layer, Stream /*stream*/) {
  const int64_t T = topk_idx.dim(0), K = topk_idx.dim(1), N = num_experts;

  int32_t* idx = topk_idx.i32();
  float* wt = topk_weight.f32();
  const float weight = 1.0f / static_cast<float>(K);
#pragma omp parallel for schedule(static) if (T * K >= kMinParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    int32_t* row = idx + t * K;
    if (!random) {
      for (int64_t k = 0; k < K; ++k) row[k] = static_cast<int32_t>((t * K + k) % N);
    } else {  // K distinct experts drawn uniformly, a pure function of (seed, layer, token)
      Rng rng(hash_counters(seed, static_cast<uint64_t>(layer), static_cast<uint64_t>(t)));
      for (int64_t k = 0; k < K; ++k) {
        int32_t e;
        do {
          e = static_cast<int32_t>(rng.below(static_cast<uint64_t>(N)));
        } while (std::find(row, row + k, e) != row + k);  // a repeat: draw again
        row[k] = e;
      }
    }
    for (int64_t k = 0; k < K; ++k) wt[t * K + k] = weight;
  }
}

int64_t router_losses_workspace_elems(int64_t /*tokens*/, int64_t /*experts*/) { return 0; }

void router_losses(Tensor lb_loss, Tensor z_loss, Tensor expert_counts, Tensor scores, Tensor logits, int top_k,
                   Tensor /*workspace*/, Stream /*stream*/) {
  const int64_t T = logits.dim(0), N = logits.dim(1);

  const float* L = logits.f32();
  const float* S = scores.f32();
  const int32_t* C = expert_counts.i32();

  // Per-expert score sums and per-token logsumexp^2, each written to its own slot, then summed
  // serially in index order: deterministic for any thread count.
  std::vector<double> score_sum(static_cast<size_t>(N));
  std::vector<double> lse_sq(static_cast<size_t>(T));
#pragma omp parallel if (T * N >= kMinParallelWork)
  {
#pragma omp for schedule(static) nowait
    for (int64_t e = 0; e < N; ++e) {
      double sum = 0.0;
      for (int64_t t = 0; t < T; ++t) sum += S[t * N + e];
      score_sum[e] = sum;
    }
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const double lse = logsumexp(L + t * N, N);
      lse_sq[t] = lse * lse;
    }
  }

  double lb = 0.0;
  for (int64_t e = 0; e < N; ++e) lb += (static_cast<double>(C[e]) / T) * (score_sum[e] / T);
  lb *= static_cast<double>(N) / top_k;
  double z = 0.0;
  for (int64_t t = 0; t < T; ++t) z += lse_sq[t];
  z /= T;
  lb_loss.f32()[0] = static_cast<float>(lb);
  z_loss.f32()[0] = static_cast<float>(z);
}

void router_backward(Tensor dlogits, Tensor dtopk_weight, Tensor topk_idx, Tensor topk_weight, Tensor scores,
                     Tensor logits, Tensor expert_counts, float lb_scale, float z_scale, ScoreFn fn, bool normalize,
                     Stream /*stream*/) {
  const auto [T, N, K] = dims(logits, topk_idx);
  if (T == 0) return;

  const float* L = logits.f32();
  const float* S = scores.f32();
  const float* DW = dtopk_weight.f32();
  const float* W = topk_weight.f32();
  const int32_t* I = topk_idx.i32();
  const int32_t* C = expert_counts.i32();
  float* DL = dlogits.f32();

  // d lb / d scores[t,e] = lb_scale * (N/K) * (count_e/T) / T: the same for every token.
  std::vector<float> lb_grad(static_cast<size_t>(N));
  const double lb_coef = static_cast<double>(lb_scale) * static_cast<double>(N) / K / (static_cast<double>(T) * T);
  for (int64_t e = 0; e < N; ++e) lb_grad[e] = static_cast<float>(lb_coef * C[e]);
  const double z_coef = 2.0 * static_cast<double>(z_scale) / T;

#pragma omp parallel for schedule(static) if (T * N >= kMinParallelWork)
  for (int64_t t = 0; t < T; ++t) {
    const float* l = L + t * N;
    const float* s = S + t * N;
    const int32_t* idx = I + t * K;
    const float* dw = DW + t * K;
    const float* w = W + t * K;
    float* dl = DL + t * N;

    // dscores, built in the dlogits row.
    for (int64_t e = 0; e < N; ++e) dl[e] = lb_grad[e];
    if (normalize) {
      // w_k = s_k / S  =>  ds_k = (dw_k - sum_j dw_j w_j) / S.
      double sel_sum = 0.0, dot = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        sel_sum += s[idx[k]];
        dot += static_cast<double>(dw[k]) * w[k];
      }
      if (sel_sum > 0.0)
        for (int64_t k = 0; k < K; ++k) dl[idx[k]] += static_cast<float>((dw[k] - dot) / sel_sum);
    } else {
      for (int64_t k = 0; k < K; ++k) dl[idx[k]] += dw[k];
    }

    // Through the score function.
    if (fn == ScoreFn::Softmax) {
      double dot = 0.0;
      for (int64_t e = 0; e < N; ++e) dot += static_cast<double>(dl[e]) * s[e];
      for (int64_t e = 0; e < N; ++e) dl[e] = s[e] * static_cast<float>(dl[e] - dot);
    } else {
      for (int64_t e = 0; e < N; ++e) dl[e] = dl[e] * s[e] * (1.0f - s[e]);
    }

    // z-loss: d/dlogits of z_scale * mean_t lse_t^2, through softmax(logits) whatever the score function.
    if (z_scale != 0.0f) {
      const double lse = logsumexp(l, N);
      const double coef = z_coef * lse;
      for (int64_t e = 0; e < N; ++e) dl[e] += static_cast<float>(coef * std::exp(static_cast<double>(l[e]) - lse));
    }
  }
}

}  // namespace moe::cpu

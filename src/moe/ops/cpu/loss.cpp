// CPU LM head + cross-entropy. Rows are processed in chunks of workspace.dim(0): the chunk's
// logits are formed in the workspace by sgemm, turned into per-row losses, then overwritten in
// place by the logit gradient, which two more sgemms turn into dh and dweight.
#include "moe/ops/cpu/loss.h"

#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <cstring>

namespace moe::cpu {
namespace {

// Per-thread partial loss sums live on the stack; summing them in thread order keeps the loss
// deterministic for a given thread count.
constexpr int kMaxThreads = 256;

}  // namespace

void lm_head_cross_entropy(Tensor loss_sum, Tensor dh, Tensor dweight, Tensor h, Tensor weight, Tensor targets,
                           float grad_scale, Tensor workspace, Stream /*stream*/) {
  const int64_t R = h.dim(0), D = h.dim(1), V = weight.dim(0);
  const bool want_dh = !dh.empty(), want_dw = !dweight.empty();
  const int32_t* tgt = targets.i32();
  const int n_threads = omp_get_max_threads() < kMaxThreads ? omp_get_max_threads() : kMaxThreads;

  const int64_t chunk = workspace.dim(0);
  float* logits = workspace.f32();
  const float* hp = h.f32();
  const float* wp = weight.f32();
  double total = 0.0;
  for (int64_t r0 = 0; r0 < R; r0 += chunk) {
    const int64_t n = R - r0 < chunk ? R - r0 : chunk;
    // logits [n, V] = h[r0:r0+n] W^T
    if (D > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(V),
                  static_cast<int>(D), 1.0f, hp + r0 * D, static_cast<int>(D), wp, static_cast<int>(D), 0.0f, logits,
                  static_cast<int>(V));
    } else {
      std::memset(logits, 0, static_cast<size_t>(n * V) * sizeof(float));
    }
    double partial[kMaxThreads] = {};
    // Small chunks run on one thread: a thread team that wakes for a few rows only competes
    // with OpenBLAS's own threads for the cores.
#pragma omp parallel num_threads(n_threads) if (n * V >= (1 << 14))
    {
      double mine = 0.0;
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        float* row = logits + i * V;
        const int32_t t = tgt[r0 + i];
        if (t < 0) {  // ignored row: no loss, zero gradient
          if (want_dh || want_dw) std::memset(row, 0, static_cast<size_t>(V) * sizeof(float));
          continue;
        }
        float max_logit = row[0];
        for (int64_t j = 1; j < V; ++j) max_logit = row[j] > max_logit ? row[j] : max_logit;
        double sum_exp = 0.0;  // exponentials in FP32, their sum in double
        for (int64_t j = 0; j < V; ++j) sum_exp += std::exp(row[j] - max_logit);
        mine += static_cast<double>(max_logit) + std::log(sum_exp) - static_cast<double>(row[t]);
        if (want_dh || want_dw) {  // row <- grad_scale * (softmax - onehot)
          const float scale = static_cast<float>(grad_scale / sum_exp);
          for (int64_t j = 0; j < V; ++j) row[j] = scale * std::exp(row[j] - max_logit);
          row[t] -= grad_scale;
        }
      }
      partial[omp_get_thread_num()] = mine;
    }
    for (int i = 0; i < n_threads; ++i) total += partial[i];

    if (want_dh && D > 0)  // dh[r0:r0+n] = G W
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n), static_cast<int>(D),
                  static_cast<int>(V), 1.0f, logits, static_cast<int>(V), wp, static_cast<int>(D), 0.0f,
                  dh.f32() + r0 * D, static_cast<int>(D));
    if (want_dw && D > 0)  // dweight += G^T h[r0:r0+n]
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(V), static_cast<int>(D),
                  static_cast<int>(n), 1.0f, logits, static_cast<int>(V), hp + r0 * D, static_cast<int>(D), 1.0f,
                  dweight.f32(), static_cast<int>(D));
  }
  loss_sum.f32()[0] = static_cast<float>(total);
}

}  // namespace moe::cpu

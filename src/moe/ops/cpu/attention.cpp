// CPU causal attention with grouped-query heads.
//
// Forward: one task per (batch, query head, block of kQueryBlock queries). The task walks the
// keys 0..t in blocks of kKeyBlock with an online softmax (running max m, running sum l and an
// unnormalized output accumulator), so no T x T matrix ever exists. It writes out and
// lse = m + log(l).
//
// Backward: one task per (batch, kv head), covering every query head of the group, so the task
// is the only writer of its dk/dv rows (the group sum needs no atomics) and of its heads' dq
// rows. For each query block it computes D_i = dout_i . out_i, then for each visible key j
// recomputes P_ij = exp(q_i . k_j * scale - lse_i) and applies
//   dv_j += P_ij dout_i,  dS_ij = P_ij (dout_i . v_j - D_i),
//   dq_i += scale dS_ij k_j,  dk_j += scale dS_ij q_i.
//
// Scratch is per thread, carved from the caller's workspace: [S block | accumulator | m | l] in
// forward, [D] in backward. NOTES: backward parallelism is B * Hkv tasks; with one sequence and
// one kv head it runs on one thread. Splitting dk/dv and dq into two passes would lift that.
#include "moe/ops/cpu/attention.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace moe::cpu {
namespace {

constexpr int64_t kQueryBlock = 32;
constexpr int64_t kKeyBlock = 64;

int64_t forward_scratch_elems(int64_t head_dim) {
  return kQueryBlock * kKeyBlock + kQueryBlock * head_dim + 2 * kQueryBlock;
}
int64_t backward_scratch_elems() { return kQueryBlock; }
int64_t per_thread_elems(int64_t head_dim) {
  const int64_t f = forward_scratch_elems(head_dim), b = backward_scratch_elems();
  return f > b ? f : b;
}

inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t d = 0; d < n; ++d) y[d] += alpha * x[d];
}

}  // namespace

int64_t attention_workspace_elems(const AttentionShape& s) {
  return per_thread_elems(s.head_dim) * omp_get_max_threads();
}

void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttentionShape& s,
                       Tensor workspace, Stream /*stream*/) {
  const int64_t B = s.batch, T = s.seq_len, Hq = s.n_heads, Hkv = s.n_kv_heads, hd = s.head_dim;
  const int n_threads = omp_get_max_threads();  // the workspace covers them (ops/attention.cpp)

  const int64_t group = Hq / Hkv;
  const int64_t n_qblocks = (T + kQueryBlock - 1) / kQueryBlock;
  const int64_t n_tasks = B * Hq * n_qblocks;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const float* qp = q.f32();
  const float* kp = k.f32();
  const float* vp = v.f32();
  float* op_ = out.f32();
  float* lp = lse.f32();
  float* ws = workspace.f32();
  const int64_t per_thread = per_thread_elems(hd);

#pragma omp parallel num_threads(n_threads)
  {
    float* scores = ws + omp_get_thread_num() * per_thread;  // [kQueryBlock, kKeyBlock]
    float* acc = scores + kQueryBlock * kKeyBlock;            // [kQueryBlock, hd]
    float* run_max = acc + kQueryBlock * hd;                  // [kQueryBlock]
    float* run_sum = run_max + kQueryBlock;                   // [kQueryBlock]
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < n_tasks; ++task) {
      const int64_t qb = task % n_qblocks;
      const int64_t h = (task / n_qblocks) % Hq;
      const int64_t b = task / (n_qblocks * Hq);
      const int64_t kh = h / group;
      const int64_t t0 = qb * kQueryBlock;
      const int64_t t1 = t0 + kQueryBlock < T ? t0 + kQueryBlock : T;
      const int64_t nq = t1 - t0;
      auto q_row = [&](int64_t t) { return qp + ((b * T + t) * Hq + h) * hd; };
      auto k_row = [&](int64_t t) { return kp + ((b * T + t) * Hkv + kh) * hd; };
      auto v_row = [&](int64_t t) { return vp + ((b * T + t) * Hkv + kh) * hd; };

      for (int64_t i = 0; i < nq; ++i) {
        run_max[i] = -std::numeric_limits<float>::infinity();
        run_sum[i] = 0.0f;
      }
      std::memset(acc, 0, static_cast<size_t>(nq * hd) * sizeof(float));

      for (int64_t s0 = 0; s0 < t1; s0 += kKeyBlock) {
        const int64_t s1 = s0 + kKeyBlock < t1 ? s0 + kKeyBlock : t1;
        for (int64_t i = 0; i < nq; ++i) {
          const int64_t t = t0 + i;
          if (t < s0) continue;  // every key of this block is in the future of query t
          const int64_t j_end = s1 < t + 1 ? s1 : t + 1;
          const float* qi = q_row(t);
          float* srow = scores + i * kKeyBlock;
          float block_max = -std::numeric_limits<float>::infinity();
          for (int64_t j = s0; j < j_end; ++j) {
            const float sc = dot(qi, k_row(j), hd) * scale;
            srow[j - s0] = sc;
            block_max = sc > block_max ? sc : block_max;
          }
          const float new_max = block_max > run_max[i] ? block_max : run_max[i];
          const float correction = std::exp(run_max[i] - new_max);  // 0 on the first block
          float* acc_i = acc + i * hd;
          float sum = run_sum[i] * correction;
          for (int64_t d = 0; d < hd; ++d) acc_i[d] *= correction;
          for (int64_t j = s0; j < j_end; ++j) {
            const float p = std::exp(srow[j - s0] - new_max);
            sum += p;
            axpy(p, v_row(j), acc_i, hd);
          }
          run_sum[i] = sum;
          run_max[i] = new_max;
        }
      }

      for (int64_t i = 0; i < nq; ++i) {
        const int64_t t = t0 + i;
        const float inv_sum = 1.0f / run_sum[i];
        float* o = op_ + ((b * T + t) * Hq + h) * hd;
        const float* acc_i = acc + i * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] = acc_i[d] * inv_sum;
        lp[(b * Hq + h) * T + t] = run_max[i] + std::log(run_sum[i]);
      }
    }
  }
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                        Tensor lse, const AttentionShape& s, Tensor workspace, Stream /*stream*/) {
  const int64_t B = s.batch, T = s.seq_len, Hq = s.n_heads, Hkv = s.n_kv_heads, hd = s.head_dim;
  const int n_threads = omp_get_max_threads();  // the workspace covers them (ops/attention.cpp)

  const int64_t group = Hq / Hkv;
  const int64_t n_tasks = B * Hkv;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const float* qp = q.f32();
  const float* kp = k.f32();
  const float* vp = v.f32();
  const float* op_ = out.f32();
  const float* gp = dout.f32();
  const float* lp = lse.f32();
  float* dqp = dq.f32();
  float* dkp = dk.f32();
  float* dvp = dv.f32();
  float* ws = workspace.f32();
  const int64_t per_thread = per_thread_elems(hd);

#pragma omp parallel num_threads(n_threads)
  {
    float* row_delta = ws + omp_get_thread_num() * per_thread;  // D_i for the block, [kQueryBlock]
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < n_tasks; ++task) {
      const int64_t b = task / Hkv;
      const int64_t kh = task % Hkv;
      auto kv_offset = [&](int64_t t) { return ((b * T + t) * Hkv + kh) * hd; };
      for (int64_t t = 0; t < T; ++t) {  // this task owns these dk/dv rows and its heads' dq rows
        std::memset(dkp + kv_offset(t), 0, static_cast<size_t>(hd) * sizeof(float));
        std::memset(dvp + kv_offset(t), 0, static_cast<size_t>(hd) * sizeof(float));
        for (int64_t h = kh * group; h < (kh + 1) * group; ++h)
          std::memset(dqp + ((b * T + t) * Hq + h) * hd, 0, static_cast<size_t>(hd) * sizeof(float));
      }
      for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
        auto q_offset = [&](int64_t t) { return ((b * T + t) * Hq + h) * hd; };
        for (int64_t t0 = 0; t0 < T; t0 += kQueryBlock) {
          const int64_t t1 = t0 + kQueryBlock < T ? t0 + kQueryBlock : T;
          for (int64_t t = t0; t < t1; ++t) row_delta[t - t0] = dot(gp + q_offset(t), op_ + q_offset(t), hd);
          for (int64_t s0 = 0; s0 < t1; s0 += kKeyBlock) {
            const int64_t s1 = s0 + kKeyBlock < t1 ? s0 + kKeyBlock : t1;
            for (int64_t t = t0; t < t1; ++t) {
              if (t < s0) continue;
              const int64_t j_end = s1 < t + 1 ? s1 : t + 1;
              const float* qi = qp + q_offset(t);
              const float* gi = gp + q_offset(t);
              float* dqi = dqp + q_offset(t);
              const float lse_i = lp[(b * Hq + h) * T + t];
              const float delta_i = row_delta[t - t0];
              for (int64_t j = s0; j < j_end; ++j) {
                const float* kj = kp + kv_offset(j);
                const float* vj = vp + kv_offset(j);
                const float p = std::exp(dot(qi, kj, hd) * scale - lse_i);
                const float ds = p * (dot(gi, vj, hd) - delta_i);
                axpy(p, gi, dvp + kv_offset(j), hd);
                axpy(scale * ds, kj, dqi, hd);
                axpy(scale * ds, qi, dkp + kv_offset(j), hd);
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace moe::cpu

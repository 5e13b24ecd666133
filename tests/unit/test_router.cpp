// Router ops against naive double-precision loops and central finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "moe/core/rng.h"
#include "moe/ops/router.h"

namespace moe {
namespace {

struct Problem {
  int T, N, K;
};

// Logits with a clear margin between any two experts of a token: 0.5 * (a random permutation of
// 0..N-1) + noise in [-0.05, 0.05), scaled down for large N so softmax stays well conditioned.
std::vector<float> margin_logits(int T, int N, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> logits(static_cast<size_t>(T) * N);
  const double spacing = N > 16 ? 0.2 : 0.5;
  std::vector<int> perm(N);
  for (int t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int e = N - 1; e > 0; --e) std::swap(perm[e], perm[rng.below(e + 1)]);
    for (int e = 0; e < N; ++e)
      logits[t * N + e] = static_cast<float>(spacing * (perm[e] - N / 2) + 0.1 * (rng.uniform() - 0.5));
  }
  return logits;
}

std::vector<float> random_vec(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

std::vector<double> ref_scores(const std::vector<double>& logits, int T, int N, ScoreFn fn) {
  std::vector<double> s(logits.size());
  for (int t = 0; t < T; ++t) {
    const double* l = &logits[t * N];
    if (fn == ScoreFn::Softmax) {
      const double mx = *std::max_element(l, l + N);
      double sum = 0;
      for (int e = 0; e < N; ++e) sum += std::exp(l[e] - mx);
      for (int e = 0; e < N; ++e) s[t * N + e] = std::exp(l[e] - mx) / sum;
    } else {
      for (int e = 0; e < N; ++e) s[t * N + e] = 1.0 / (1.0 + std::exp(-l[e]));
    }
  }
  return s;
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// Naive top-K: sort expert ids by (key descending, id ascending), keep the first K.
std::vector<int> ref_topk(const std::vector<double>& keys, int T, int N, int K) {
  std::vector<int> idx(static_cast<size_t>(T) * K);
  std::vector<int> order(N);
  for (int t = 0; t < T; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return keys[t * N + a] > keys[t * N + b]; });
    for (int k = 0; k < K; ++k) idx[t * K + k] = order[k];
  }
  return idx;
}

std::vector<double> ref_weights(const std::vector<double>& s, const std::vector<int>& idx, int T, int N, int K,
                                bool normalize) {
  std::vector<double> w(static_cast<size_t>(T) * K);
  for (int t = 0; t < T; ++t) {
    double sum = 0;
    for (int k = 0; k < K; ++k) sum += s[t * N + idx[t * K + k]];
    for (int k = 0; k < K; ++k) w[t * K + k] = s[t * N + idx[t * K + k]] / (normalize ? sum : 1.0);
  }
  return w;
}

std::vector<int32_t> ref_counts(const std::vector<int32_t>& idx, int N) {
  std::vector<int32_t> c(N, 0);
  for (int32_t e : idx) ++c[e];
  return c;
}

double ref_lb(const std::vector<double>& s, const std::vector<int32_t>& counts, int T, int N, int K) {
  double lb = 0;
  for (int e = 0; e < N; ++e) {
    double p = 0;
    for (int t = 0; t < T; ++t) p += s[t * N + e];
    lb += (static_cast<double>(counts[e]) / T) * (p / T);
  }
  return lb * N / K;
}

double ref_lse(const double* l, int N) {
  const double mx = *std::max_element(l, l + N);
  double sum = 0;
  for (int e = 0; e < N; ++e) sum += std::exp(l[e] - mx);
  return mx + std::log(sum);
}

double ref_z(const std::vector<double>& logits, int T, int N) {
  double z = 0;
  for (int t = 0; t < T; ++t) {
    const double lse = ref_lse(&logits[t * N], N);
    z += lse * lse;
  }
  return z / T;
}

struct Objective {
  int T, N, K;
  ScoreFn fn;
  bool normalize;
  std::vector<int32_t> idx;     // the selection, held fixed
  std::vector<int32_t> counts;  // constants
  std::vector<double> dw;       // R[t,k]
  double lb_scale, z_scale;

  // sum_{t,k} R[t,k] w[t,k] + a lb + b z in double with the selection held fixed.
  double operator()(const std::vector<double>& logits) const {
    const auto s = ref_scores(logits, T, N, fn);
    const auto w = ref_weights(s, std::vector<int>(idx.begin(), idx.end()), T, N, K, normalize);
    double f = 0;
    for (size_t i = 0; i < w.size(); ++i) f += dw[i] * w[i];
    return f + lb_scale * ref_lb(s, counts, T, N, K) + z_scale * ref_z(logits, T, N);
  }

  // Naive backward in double, written from the chain rule element by element.
  std::vector<double> grad(const std::vector<double>& logits) const {
    const auto s = ref_scores(logits, T, N, fn);
    std::vector<double> ds(s.size(), 0.0), dl(s.size(), 0.0);
    for (int t = 0; t < T; ++t) {
      for (int e = 0; e < N; ++e) ds[t * N + e] += lb_scale * (double(N) / K) * (double(counts[e]) / T) / T;
      double S = 0;
      for (int k = 0; k < K; ++k) S += s[t * N + idx[t * K + k]];
      // dw_k/ds_j = (delta_kj * S - s_k) / S^2 with normalize, delta_kj without.
      for (int k = 0; k < K; ++k)
        for (int j = 0; j < K; ++j) {
          const int ek = idx[t * K + k], ej = idx[t * K + j];
          double d = normalize ? ((k == j ? S : 0.0) - s[t * N + ek]) / (S * S) : (k == j ? 1.0 : 0.0);
          ds[t * N + ej] += dw[t * K + k] * d;
        }
      for (int e = 0; e < N; ++e)
        for (int j = 0; j < N; ++j) {
          // d s_j / d l_e.
          double J;
          if (fn == ScoreFn::Softmax)
            J = s[t * N + j] * ((j == e ? 1.0 : 0.0) - s[t * N + e]);
          else
            J = (j == e) ? s[t * N + j] * (1 - s[t * N + j]) : 0.0;
          dl[t * N + e] += ds[t * N + j] * J;
        }
      const double lse = ref_lse(&logits[t * N], N);
      for (int e = 0; e < N; ++e) dl[t * N + e] += z_scale * 2 * lse / T * std::exp(logits[t * N + e] - lse);
    }
    return dl;
  }
};

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

const ScoreFn kFns[] = {ScoreFn::Softmax, ScoreFn::Sigmoid};
const char* fn_name(ScoreFn fn) { return fn == ScoreFn::Softmax ? "softmax" : "sigmoid"; }

// Runs router_forward on CPU buffers.
struct Forward {
  std::vector<float> scores;
  std::vector<int32_t> idx;
  std::vector<float> w;
  Forward(std::vector<float>& logits, std::vector<float>* bias, int T, int N, int K, ScoreFn fn, bool normalize)
      : scores(static_cast<size_t>(T) * N), idx(static_cast<size_t>(T) * K), w(static_cast<size_t>(T) * K) {
    Tensor b = bias ? f32_tensor(bias->data(), {N}) : Tensor();
    router_forward(f32_tensor(scores.data(), {T, N}), i32_tensor(idx.data(), {T, K}), f32_tensor(w.data(), {T, K}),
                   f32_tensor(logits.data(), {T, N}), b, fn, normalize);
  }
};

// Scores within 1e-6 relative (+1e-7 absolute) of double; the selection equal to a naive stable
// sort of the op's own FP32 scores (+ bias), which is how the header defines it; weights within
// 2e-6 relative (+1e-7 absolute) of the double weights at that selection.
TEST(Router, forward_matches_naive_double) {
  // {600, 64, 8} is large enough to take the OpenMP path.
  const Problem problems[] = {{1, 4, 1}, {7, 8, 2}, {33, 16, 4}, {64, 64, 8}, {5, 6, 6}, {17, 128, 8}, {600, 64, 8}};
  uint64_t seed = 1;
  for (const auto& p : problems)
    for (ScoreFn fn : kFns)
      for (bool normalize : {false, true})
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(testing::Message() << "T=" << p.T << " N=" << p.N << " K=" << p.K << " " << fn_name(fn)
                                          << " normalize=" << normalize << " bias=" << with_bias);
          auto logits = random_vec(static_cast<size_t>(p.T) * p.N, ++seed, 2.0);
          auto bias = random_vec(p.N, ++seed, 0.05);
          Forward out(logits, with_bias ? &bias : nullptr, p.T, p.N, p.K, fn, normalize);

          const auto s = ref_scores(to_double(logits), p.T, p.N, fn);
          for (size_t i = 0; i < s.size(); ++i) ASSERT_NEAR(out.scores[i], s[i], 1e-6 * std::abs(s[i]) + 1e-7);

          std::vector<double> keys(s.size());
          for (int t = 0; t < p.T; ++t)
            for (int e = 0; e < p.N; ++e)
              keys[t * p.N + e] = with_bias ? double(out.scores[t * p.N + e] + bias[e]) : out.scores[t * p.N + e];
          const auto idx = ref_topk(keys, p.T, p.N, p.K);
          for (size_t i = 0; i < idx.size(); ++i) ASSERT_EQ(out.idx[i], idx[i]) << "route " << i;

          const auto w = ref_weights(s, idx, p.T, p.N, p.K, normalize);
          for (size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(out.w[i], w[i], 2e-6 * std::abs(w[i]) + 1e-7);
        }
}

// Equal scores: the lower expert index wins, and the order is descending by score.
TEST(Router, topk_ties_go_to_lower_expert_index) {
  const int T = 3, N = 6;
  std::vector<float> logits = {
      0,  0, 0, 0, 0, 0,  // all equal
      1,  3, 3, 0, 3, 2,  // three-way tie at the top
      -1, 2, 2, 5, 2, 2,  // one clear winner, then ties
  };
  for (ScoreFn fn : kFns) {
    SCOPED_TRACE(fn_name(fn));
    Forward k3(logits, nullptr, T, N, 3, fn, false);
    EXPECT_EQ(k3.idx, (std::vector<int32_t>{0, 1, 2, 1, 2, 4, 3, 1, 2}));
    Forward k4(logits, nullptr, T, N, 4, fn, false);
    EXPECT_EQ(k4.idx, (std::vector<int32_t>{0, 1, 2, 3, 1, 2, 4, 5, 3, 1, 2, 4}));
    // K = N: a full descending order with ties by index.
    Forward kn(logits, nullptr, T, N, N, fn, true);
    EXPECT_EQ(kn.idx, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 1, 2, 4, 5, 0, 3, 3, 1, 2, 4, 5, 0}));
    for (int t = 0; t < T; ++t)
      for (int k = 1; k < N; ++k)
        EXPECT_GE(kn.scores[t * N + kn.idx[t * N + k - 1]], kn.scores[t * N + kn.idx[t * N + k]]);
  }
}

// K = N with normalize: softmax weights are the scores themselves (they already sum to 1), and
// sigmoid weights sum to 1.
TEST(Router, k_equals_n_normalized_weights) {
  const int T = 9, N = 5;
  auto logits = random_vec(T * N, 11);
  for (ScoreFn fn : kFns) {
    Forward out(logits, nullptr, T, N, N, fn, true);
    for (int t = 0; t < T; ++t) {
      double sum = 0;
      for (int k = 0; k < N; ++k) {
        sum += out.w[t * N + k];
        if (fn == ScoreFn::Softmax) {
          EXPECT_NEAR(out.w[t * N + k], out.scores[t * N + out.idx[t * N + k]], 1e-6);
        }
      }
      EXPECT_NEAR(sum, 1.0, 1e-6) << fn_name(fn) << " token " << t;
    }
  }
}

// A bias changes which experts are chosen but not the weights: the weights are the scores at the
// chosen experts (normalized over those scores), with no bias in them.
TEST(Router, selection_bias_changes_choice_not_weights) {
  const int T = 2, N = 4, K = 2;
  std::vector<float> logits = {2.0f, 1.5f, 1.0f, 0.0f, 0.0f, 1.0f, 2.0f, 1.5f};
  std::vector<float> bias = {0.0f, 0.0f, 0.0f, 10.0f};  // forces expert 3 to the front
  for (ScoreFn fn : kFns)
    for (bool normalize : {false, true}) {
      SCOPED_TRACE(testing::Message() << fn_name(fn) << " normalize=" << normalize);
      Forward plain(logits, nullptr, T, N, K, fn, normalize);
      EXPECT_EQ(plain.idx, (std::vector<int32_t>{0, 1, 2, 3}));
      Forward biased(logits, &bias, T, N, K, fn, normalize);
      EXPECT_EQ(biased.idx, (std::vector<int32_t>{3, 0, 3, 2}));
      EXPECT_EQ(biased.scores, plain.scores);
      for (int t = 0; t < T; ++t) {
        const float s0 = biased.scores[t * N + biased.idx[t * K]], s1 = biased.scores[t * N + biased.idx[t * K + 1]];
        const float sum = normalize ? s0 + s1 : 1.0f;
        EXPECT_NEAR(biased.w[t * K], s0 / sum, 1e-7);
        EXPECT_NEAR(biased.w[t * K + 1], s1 / sum, 1e-7);
      }
    }
}

// lb and z losses within 1e-6 relative of double, including experts that receive no tokens.
TEST(Router, losses_match_naive_double) {
  const Problem problems[] = {{1, 4, 1}, {7, 8, 2}, {33, 16, 4}, {64, 64, 8}, {5, 6, 6}, {600, 64, 8}};
  uint64_t seed = 100;
  for (const auto& p : problems)
    for (ScoreFn fn : kFns) {
      SCOPED_TRACE(testing::Message() << "T=" << p.T << " N=" << p.N << " K=" << p.K << " " << fn_name(fn));
      auto logits = random_vec(static_cast<size_t>(p.T) * p.N, ++seed, 2.0);
      if (p.K < p.N)  // the last expert never wins: it receives zero tokens
        for (int t = 0; t < p.T; ++t) logits[t * p.N + p.N - 1] = -20.0f;
      Forward out(logits, nullptr, p.T, p.N, p.K, fn, true);
      const auto counts = ref_counts(out.idx, p.N);
      if (p.K < p.N) {
        ASSERT_EQ(counts[p.N - 1], 0);
      }
      float lb = -1, z = -1;
      auto counts_mut = counts;
      router_losses(f32_tensor(&lb, {1}), f32_tensor(&z, {1}), i32_tensor(counts_mut.data(), {p.N}),
                    f32_tensor(out.scores.data(), {p.T, p.N}), f32_tensor(logits.data(), {p.T, p.N}), p.K, Tensor());
      const auto ld = to_double(logits);
      const double lb_ref = ref_lb(ref_scores(ld, p.T, p.N, fn), counts, p.T, p.N, p.K);
      const double z_ref = ref_z(ld, p.T, p.N);
      EXPECT_NEAR(lb, lb_ref, 1e-6 * std::abs(lb_ref) + 1e-7);
      EXPECT_NEAR(z, z_ref, 1e-6 * std::abs(z_ref) + 1e-7);
    }
}

// Uniform scores and uniform counts give lb = 1 exactly (up to rounding); z = log(N)^2 for zero logits.
TEST(Router, balanced_lb_loss_is_one) {
  const int T = 8, N = 4, K = 2;
  std::vector<float> logits(T * N, 0.0f);
  Forward out(logits, nullptr, T, N, K, ScoreFn::Softmax, true);
  std::vector<int32_t> counts(N, T * K / N);
  float lb = 0, z = 0;
  router_losses(f32_tensor(&lb, {1}), f32_tensor(&z, {1}), i32_tensor(counts.data(), {N}),
                f32_tensor(out.scores.data(), {T, N}), f32_tensor(logits.data(), {T, N}), K, Tensor());
  EXPECT_NEAR(lb, 1.0, 1e-6);
  EXPECT_NEAR(z, std::log(4.0) * std::log(4.0), 1e-6);
}

// Backward, three ways. The naive double backward must agree with double central differences
// (h = 1e-5, tolerance 1e-7 relative to the largest gradient): this validates the reference.
// The FP32 op must agree with the naive double backward within 1e-5 relative to the largest
// gradient (+1e-7). The objective holds the selection fixed; the logits have margins of ~0.5, so
// a step of h cannot change the top-K, which is asserted by re-selecting on the perturbed logits.
TEST(Router, backward_matches_naive_double_and_finite_differences) {
  const Problem problems[] = {{6, 8, 2}, {5, 4, 4}, {4, 6, 1}, {9, 16, 3}};
  uint64_t seed = 200;
  for (const auto& p : problems)
    for (ScoreFn fn : kFns)
      for (bool normalize : {false, true}) {
        SCOPED_TRACE(testing::Message() << "T=" << p.T << " N=" << p.N << " K=" << p.K << " " << fn_name(fn)
                                        << " normalize=" << normalize);
        auto logits = margin_logits(p.T, p.N, ++seed);
        Forward out(logits, nullptr, p.T, p.N, p.K, fn, normalize);
        auto dw = random_vec(static_cast<size_t>(p.T) * p.K, ++seed);
        Objective obj{p.T, p.N, p.K, fn, normalize, out.idx, ref_counts(out.idx, p.N), to_double(dw), 0.7, 0.3};

        const auto ld = to_double(logits);
        const auto g_ref = obj.grad(ld);
        const double scale = max_abs(g_ref);
        ASSERT_GT(scale, 1e-3);
        const double h = 1e-5;
        for (size_t i = 0; i < ld.size(); ++i) {
          auto lp = ld, lm = ld;
          lp[i] += h;
          lm[i] -= h;
          for (const auto* l : {&lp, &lm}) {
            const auto sel = ref_topk(ref_scores(*l, p.T, p.N, fn), p.T, p.N, p.K);
            ASSERT_TRUE(std::equal(sel.begin(), sel.end(), out.idx.begin())) << "the step changed the top-K";
          }
          const double fd = (obj(lp) - obj(lm)) / (2 * h);
          ASSERT_NEAR(g_ref[i], fd, 1e-7 * scale) << "logit " << i;
        }

        std::vector<float> dlogits(ld.size(), std::nanf(""));
        auto counts = obj.counts;
        router_backward(f32_tensor(dlogits.data(), {p.T, p.N}), f32_tensor(dw.data(), {p.T, p.K}),
                        i32_tensor(out.idx.data(), {p.T, p.K}), f32_tensor(out.w.data(), {p.T, p.K}),
                        f32_tensor(out.scores.data(), {p.T, p.N}), f32_tensor(logits.data(), {p.T, p.N}),
                        i32_tensor(counts.data(), {p.N}), 0.7f, 0.3f, fn, normalize);
        for (size_t i = 0; i < ld.size(); ++i) ASSERT_NEAR(dlogits[i], g_ref[i], 1e-5 * scale + 1e-7) << "logit " << i;
      }
}

// The OpenMP path (T*N above the parallel threshold) against the naive double backward, with a
// selection bias in the forward (backward does not see it). Tolerance as above.
TEST(Router, backward_large_matches_naive_double) {
  const int T = 600, N = 64, K = 8;
  for (ScoreFn fn : kFns)
    for (bool normalize : {false, true}) {
      SCOPED_TRACE(testing::Message() << fn_name(fn) << " normalize=" << normalize);
      auto logits = random_vec(T * N, 400 + 2 * normalize + (fn == ScoreFn::Softmax), 2.0);
      auto bias = random_vec(N, 401, 0.05);
      auto dw = random_vec(T * K, 402);
      Forward out(logits, &bias, T, N, K, fn, normalize);
      Objective obj{T, N, K, fn, normalize, out.idx, ref_counts(out.idx, N), to_double(dw), 0.01, 0.001};
      const auto g_ref = obj.grad(to_double(logits));
      const double scale = max_abs(g_ref);
      std::vector<float> dlogits(T * N);
      router_backward(f32_tensor(dlogits.data(), {T, N}), f32_tensor(dw.data(), {T, K}),
                      i32_tensor(out.idx.data(), {T, K}), f32_tensor(out.w.data(), {T, K}),
                      f32_tensor(out.scores.data(), {T, N}), f32_tensor(logits.data(), {T, N}),
                      i32_tensor(obj.counts.data(), {N}), 0.01f, 0.001f, fn, normalize);
      for (int i = 0; i < T * N; ++i) ASSERT_NEAR(dlogits[i], g_ref[i], 1e-5 * scale + 1e-7) << "logit " << i;
    }
}

// Finite differences straight through the FP32 ops (router_forward + router_losses, objective
// summed in double, h = 1e-2): checks the forward and backward code agree with each other.
// Tolerance 2e-3 relative to the largest gradient (FP32 rounding / h plus O(h^2) truncation).
TEST(Router, backward_matches_finite_differences_of_fp32_forward) {
  const int T = 6, N = 8, K = 3;
  const float a = 0.7f, b = 0.3f;
  for (ScoreFn fn : kFns)
    for (bool normalize : {false, true}) {
      SCOPED_TRACE(testing::Message() << fn_name(fn) << " normalize=" << normalize);
      auto logits = margin_logits(T, N, 300 + (fn == ScoreFn::Softmax) + 2 * normalize);
      auto dw = random_vec(T * K, 301);
      Forward base(logits, nullptr, T, N, K, fn, normalize);
      auto counts = ref_counts(base.idx, N);
      auto objective = [&](std::vector<float>& l) {
        Forward f(l, nullptr, T, N, K, fn, normalize);
        EXPECT_EQ(f.idx, base.idx) << "the step changed the top-K";
        float lb = 0, z = 0;
        router_losses(f32_tensor(&lb, {1}), f32_tensor(&z, {1}), i32_tensor(counts.data(), {N}),
                      f32_tensor(f.scores.data(), {T, N}), f32_tensor(l.data(), {T, N}), K, Tensor());
        double sum = 0;
        for (int i = 0; i < T * K; ++i) sum += double(dw[i]) * f.w[i];
        return sum + double(a) * lb + double(b) * z;
      };
      std::vector<float> dlogits(T * N);
      router_backward(f32_tensor(dlogits.data(), {T, N}), f32_tensor(dw.data(), {T, K}),
                      i32_tensor(base.idx.data(), {T, K}), f32_tensor(base.w.data(), {T, K}),
                      f32_tensor(base.scores.data(), {T, N}), f32_tensor(logits.data(), {T, N}),
                      i32_tensor(counts.data(), {N}), a, b, fn, normalize);
      double scale = 0;
      for (float g : dlogits) scale = std::max(scale, double(std::abs(g)));
      const float h = 1e-2f;
      for (int i = 0; i < T * N; ++i) {
        auto lp = logits, lm = logits;
        lp[i] += h;
        lm[i] -= h;
        const double fd = (objective(lp) - objective(lm)) / (double(lp[i]) - double(lm[i]));
        EXPECT_NEAR(dlogits[i], fd, 2e-3 * scale) << "logit " << i;
      }
    }
}

TEST(Router, rejects_bad_shapes_and_dtypes) {
  std::vector<float> logits(12), scores(12), w(6);
  std::vector<int32_t> idx(6);
  auto call = [&](Tensor l, Tensor i) {
    router_forward(f32_tensor(scores.data(), {4, 3}), i, f32_tensor(w.data(), {4, 2}), l, Tensor(), ScoreFn::Softmax,
                   true);
  };
  EXPECT_THROW(call(f32_tensor(logits.data(), {4, 3}), f32_tensor(reinterpret_cast<float*>(idx.data()), {4, 2})),
               Error);
  EXPECT_THROW(call(f32_tensor(logits.data(), {3, 4}), i32_tensor(idx.data(), {3, 2})), Error);
  try {
    call(f32_tensor(logits.data(), {4, 3}), i32_tensor(idx.data(), {2, 3}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("router_forward"), std::string::npos) << e.what();
  }
}

// The benchmark routings as Transformer::moe_forward_layer computed them on the host before
// synthetic_routing existed: the op must reproduce this loop exactly.
void ref_synthetic_routing(std::vector<int32_t>& idx_v, std::vector<float>& wt_v, bool random, int64_t T, int64_t K,
                           int64_t N, uint64_t routing_seed, int64_t l) {
  int32_t* idx = idx_v.data();
  float* wt = wt_v.data();
  for (int64_t t = 0; t < T; ++t) {
    if (!random) {
      for (int64_t k = 0; k < K; ++k) idx[t * K + k] = static_cast<int32_t>((t * K + k) % N);
    } else {
      Rng rng(hash_counters(routing_seed, static_cast<uint64_t>(l), static_cast<uint64_t>(t)));
      for (int64_t k = 0; k < K; ++k) {
        int32_t e;
        bool fresh;
        do {
          e = static_cast<int32_t>(rng.below(static_cast<uint64_t>(N)));
          fresh = std::find(idx + t * K, idx + t * K + k, e) == idx + t * K + k;
        } while (!fresh);
        idx[t * K + k] = e;
      }
    }
    for (int64_t k = 0; k < K; ++k) wt[t * K + k] = 1.0f / static_cast<float>(K);
  }
}

// Both modes equal the former host loop exactly (ids and weight bits) over shapes including K = N,
// one token, and T * K large enough for the OpenMP path; random rows hold K distinct experts.
TEST(Router, synthetic_routing_matches_the_host_loop_it_replaces) {
  const Problem shapes[] = {{1, 1, 1}, {1, 8, 8}, {37, 8, 2}, {100, 16, 16}, {5000, 64, 8}, {300, 128, 128}};
  for (const auto& p : shapes)
    for (bool random : {false, true})
      for (uint64_t seed : {uint64_t{0}, uint64_t{12345}})
        for (int64_t layer : {int64_t{0}, int64_t{3}}) {
          SCOPED_TRACE(testing::Message() << "T=" << p.T << " N=" << p.N << " K=" << p.K << " random=" << random
                                          << " seed=" << seed << " layer=" << layer);
          const size_t n = static_cast<size_t>(p.T) * p.K;
          std::vector<int32_t> idx(n, -7), want_idx(n, -7);
          std::vector<float> wt(n, -1.0f), want_wt(n, -1.0f);
          synthetic_routing(i32_tensor(idx.data(), {p.T, p.K}), f32_tensor(wt.data(), {p.T, p.K}), random, p.N, seed,
                            layer);
          ref_synthetic_routing(want_idx, want_wt, random, p.T, p.K, p.N, seed, layer);
          ASSERT_EQ(idx, want_idx);
          ASSERT_EQ(std::memcmp(wt.data(), want_wt.data(), n * sizeof(float)), 0);
          for (int t = 0; t < p.T; ++t) {
            std::vector<int32_t> row(idx.begin() + t * p.K, idx.begin() + (t + 1) * p.K);
            std::sort(row.begin(), row.end());
            ASSERT_EQ(std::adjacent_find(row.begin(), row.end()), row.end()) << "token " << t << " repeats an expert";
            ASSERT_GE(row.front(), 0);
            ASSERT_LT(row.back(), p.N);
          }
        }
}

// Random routing is a pure function of (seed, layer, t): a token's row does not depend on T, and
// another layer or seed draws another routing.
TEST(Router, synthetic_random_routing_depends_on_seed_layer_and_token_only) {
  const int N = 32, K = 4;
  auto route = [&](int T, uint64_t seed, int64_t layer) {
    std::vector<int32_t> idx(static_cast<size_t>(T) * K);
    std::vector<float> wt(idx.size());
    synthetic_routing(i32_tensor(idx.data(), {T, K}), f32_tensor(wt.data(), {T, K}), true, N, seed, layer);
    return idx;
  };
  const auto base = route(50, 7, 2);
  const auto longer = route(200, 7, 2);
  EXPECT_TRUE(std::equal(base.begin(), base.end(), longer.begin())) << "rows depend on T";
  EXPECT_NE(base, route(50, 7, 3)) << "layer is ignored";
  EXPECT_NE(base, route(50, 8, 2)) << "seed is ignored";
}

TEST(Router, synthetic_routing_rejects_impossible_or_mismatched_inputs) {
  std::vector<int32_t> idx(12);
  std::vector<float> wt(12);
  auto call = [&](Tensor i, Tensor w, int64_t N, int64_t layer) { synthetic_routing(i, w, true, N, 1, layer); };
  const Tensor i43 = i32_tensor(idx.data(), {4, 3}), w43 = f32_tensor(wt.data(), {4, 3});
  EXPECT_NO_THROW(call(i43, w43, 3, 0));                                         // K = N
  EXPECT_THROW(call(i43, w43, 2, 0), Error);                                     // K > N: 3 distinct experts of 2
  EXPECT_THROW(call(i43, w43, 0, 0), Error);                                     // no experts
  EXPECT_THROW(call(i43, w43, 8, -1), Error);                                    // negative layer
  EXPECT_THROW(call(i43, f32_tensor(wt.data(), {3, 4}), 8, 0), Error);           // weight shape
  EXPECT_THROW(call(i43, Tensor(idx.data(), DType::I32, {4, 3}), 8, 0), Error);  // weight dtype
  EXPECT_THROW(call(f32_tensor(wt.data(), {4, 3}), w43, 8, 0), Error);           // idx dtype
  EXPECT_THROW(call(i32_tensor(idx.data(), {12}), f32_tensor(wt.data(), {12}), 8, 0), Error);  // not [T, K]
  try {
    call(i43, w43, 2, 0);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("synthetic_routing"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moe

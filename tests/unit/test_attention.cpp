// Causal GQA attention against a naive double implementation (full score matrix) and finite
// differences, on sequence lengths that are not multiples of the query/key blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "moe/core/rng.h"
#include "moe/ops/attention.h"

namespace {

using moe::AttentionShape;
using moe::f32_tensor;

std::vector<float> random_values(int64_t n, uint64_t seed, double scale = 1.0) {
  moe::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

struct Naive {
  std::vector<double> out, lse, dq, dk, dv;
};

// Straightforward causal softmax attention and its backward in double.
Naive naive_attention(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                      const std::vector<float>& v, const std::vector<float>& dout) {
  const int64_t B = s.batch, T = s.seq_len, Hq = s.n_heads, Hkv = s.n_kv_heads, hd = s.head_dim;
  const int64_t group = Hq / Hkv;
  const double scale = 1.0 / std::sqrt(double(hd));
  Naive n{std::vector<double>(B * T * Hq * hd, 0.0), std::vector<double>(B * Hq * T),
          std::vector<double>(B * T * Hq * hd, 0.0), std::vector<double>(B * T * Hkv * hd, 0.0),
          std::vector<double>(B * T * Hkv * hd, 0.0)};
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * T + t) * Hq + h) * hd; };
  auto ki = [&](int64_t b, int64_t t, int64_t h) { return ((b * T + t) * Hkv + h) * hd; };
  std::vector<double> p(T), dp(T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kh = h / group;
      for (int64_t t = 0; t < T; ++t) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= t; ++j) {
          double sc = 0.0;
          for (int64_t d = 0; d < hd; ++d) sc += double(q[qi(b, t, h) + d]) * k[ki(b, j, kh) + d];
          p[j] = sc * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= t; ++j) sum += std::exp(p[j] - mx);
        n.lse[(b * Hq + h) * T + t] = mx + std::log(sum);
        for (int64_t j = 0; j <= t; ++j) p[j] = std::exp(p[j] - mx) / sum;
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t d = 0; d < hd; ++d) n.out[qi(b, t, h) + d] += p[j] * v[ki(b, j, kh) + d];
        // Backward: dP_j = dout . v_j, dS = P (dP - sum_j P_j dP_j).
        double delta = 0.0;
        for (int64_t j = 0; j <= t; ++j) {
          dp[j] = 0.0;
          for (int64_t d = 0; d < hd; ++d) dp[j] += double(dout[qi(b, t, h) + d]) * v[ki(b, j, kh) + d];
          delta += p[j] * dp[j];
        }
        for (int64_t j = 0; j <= t; ++j) {
          const double ds = p[j] * (dp[j] - delta);
          for (int64_t d = 0; d < hd; ++d) {
            n.dv[ki(b, j, kh) + d] += p[j] * dout[qi(b, t, h) + d];
            n.dq[qi(b, t, h) + d] += scale * ds * k[ki(b, j, kh) + d];
            n.dk[ki(b, j, kh) + d] += scale * ds * q[qi(b, t, h) + d];
          }
        }
      }
    }
  return n;
}

struct Inputs {
  AttentionShape s;
  std::vector<float> q, k, v, dout, workspace;
  Inputs(AttentionShape shape, uint64_t seed, double qk_scale) : s(shape) {
    const int64_t rows = s.batch * s.seq_len;
    q = random_values(rows * s.n_heads * s.head_dim, seed, qk_scale);
    k = random_values(rows * s.n_kv_heads * s.head_dim, seed + 1, qk_scale);
    v = random_values(rows * s.n_kv_heads * s.head_dim, seed + 2);
    dout = random_values(rows * s.n_heads * s.head_dim, seed + 3);
    workspace.resize(static_cast<size_t>(moe::attention_workspace_elems(s)));
  }
  int64_t rows() const { return s.batch * s.seq_len; }
  int64_t q_width() const { return s.n_heads * s.head_dim; }
  int64_t kv_width() const { return s.n_kv_heads * s.head_dim; }
  moe::Tensor ws() { return f32_tensor(workspace.data(), {int64_t(workspace.size())}); }
  void forward(std::vector<float>& out, std::vector<float>& lse) {
    out.assign(rows() * q_width(), 0.0f);
    lse.assign(s.batch * s.n_heads * s.seq_len, 0.0f);
    moe::attention_forward(f32_tensor(out.data(), {rows(), q_width()}),
                           f32_tensor(lse.data(), {s.batch, s.n_heads, s.seq_len}),
                           f32_tensor(q.data(), {rows(), q_width()}), f32_tensor(k.data(), {rows(), kv_width()}),
                           f32_tensor(v.data(), {rows(), kv_width()}), s, ws());
  }
  void backward(std::vector<float>& out, std::vector<float>& lse, std::vector<float>& dq, std::vector<float>& dk,
                std::vector<float>& dv) {
    // Pre-filled with NaN: the op must overwrite every element.
    dq.assign(q.size(), std::numeric_limits<float>::quiet_NaN());
    dk.assign(k.size(), std::numeric_limits<float>::quiet_NaN());
    dv.assign(v.size(), std::numeric_limits<float>::quiet_NaN());
    moe::attention_backward(
        f32_tensor(dq.data(), {rows(), q_width()}), f32_tensor(dk.data(), {rows(), kv_width()}),
        f32_tensor(dv.data(), {rows(), kv_width()}), f32_tensor(dout.data(), {rows(), q_width()}),
        f32_tensor(q.data(), {rows(), q_width()}), f32_tensor(k.data(), {rows(), kv_width()}),
        f32_tensor(v.data(), {rows(), kv_width()}), f32_tensor(out.data(), {rows(), q_width()}),
        f32_tensor(lse.data(), {s.batch, s.n_heads, s.seq_len}), s, ws());
  }
};

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i]))) << what << " at " << i;
}

// batch, seq_len, n_heads, n_kv_heads, head_dim: T off the 32/64 blocks, GQA groups of 2 and 4, T = 1.
const AttentionShape kShapes[] = {
    {2, 45, 4, 2, 16}, {1, 70, 4, 1, 8}, {3, 1, 2, 2, 4}, {1, 130, 2, 2, 5}, {2, 33, 3, 3, 12}};

// FP32 dot products and exponentials of O(1..10) scores: 2e-5 relative (+ the same absolute)
// for out and lse, 1e-4 for the gradients, which sum up to T * group terms.
TEST(Attention, AttentionForwardAndBackwardMatchNaiveDouble) {
  uint64_t seed = 1;
  for (const auto& s : kShapes) {
    for (double qk_scale : {1.0, 3.0}) {  // 3.0 gives peaked softmaxes that exercise the rescaling
      Inputs in(s, seed, qk_scale);
      seed += 10;
      std::vector<float> out, lse, dq, dk, dv;
      in.forward(out, lse);
      in.backward(out, lse, dq, dk, dv);
      const Naive want = naive_attention(s, in.q, in.k, in.v, in.dout);
      SCOPED_TRACE(testing::Message() << "B=" << s.batch << " T=" << s.seq_len << " Hq=" << s.n_heads
                                      << " Hkv=" << s.n_kv_heads << " hd=" << s.head_dim << " qk_scale=" << qk_scale);
      expect_close(out, want.out, 2e-5, "out");
      expect_close(lse, want.lse, 2e-5, "lse");
      expect_close(dq, want.dq, 1e-4, "dq");
      expect_close(dk, want.dk, 1e-4, "dk");
      expect_close(dv, want.dv, 1e-4, "dv");
    }
  }
}

// L = sum(out * dout) with dout random, in double; central differences of the FP32 forward with
// step 1e-2 on a sample of entries of q, k and v (truncation ~1e-4, rounding ~1e-5/1e-2).
TEST(Attention, AttentionBackwardMatchesFiniteDifferences) {
  const AttentionShape s{2, 37, 4, 2, 8};
  Inputs in(s, 77, 1.0);
  std::vector<float> out, lse, dq, dk, dv;
  in.forward(out, lse);
  in.backward(out, lse, dq, dk, dv);
  auto loss = [&]() {
    std::vector<float> o, l;
    in.forward(o, l);
    double sum = 0.0;
    for (size_t i = 0; i < o.size(); ++i) sum += double(o[i]) * in.dout[i];
    return sum;
  };
  moe::Rng pick(5);
  struct Target {
    std::vector<float>* x;
    const std::vector<float>* grad;
    const char* name;
  } targets[] = {{&in.q, &dq, "dq"}, {&in.k, &dk, "dk"}, {&in.v, &dv, "dv"}};
  for (auto& t : targets) {
    for (int n = 0; n < 24; ++n) {
      const size_t i = pick.below(t.x->size());
      const float x0 = (*t.x)[i];
      (*t.x)[i] = x0 + 1e-2f;
      const double lp = loss();
      const float xp = (*t.x)[i];
      (*t.x)[i] = x0 - 1e-2f;
      const double lm = loss();
      const float xm = (*t.x)[i];
      (*t.x)[i] = x0;
      const double fd = (lp - lm) / (double(xp) - xm);
      EXPECT_NEAR((*t.grad)[i], fd, 2e-3 + 1e-2 * std::fabs(fd)) << t.name << " at " << i;
    }
  }
}

// The first query sees only key 0, so its output is exactly v_0 of its kv head and lse = its score.
TEST(Attention, AttentionFirstQueryCopiesFirstValue) {
  const AttentionShape s{1, 3, 4, 2, 6};
  Inputs in(s, 9, 1.0);
  std::vector<float> out, lse;
  in.forward(out, lse);
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t d = 0; d < 6; ++d) EXPECT_FLOAT_EQ(out[h * 6 + d], in.v[(h / 2) * 6 + d]);
}

TEST(Attention, AttentionWorkspaceCoversAllThreadsAndTooSmallIsRejected) {
  const AttentionShape s{1, 40, 2, 1, 16};
  EXPECT_GE(moe::attention_workspace_elems(s), 32 * 16);
  Inputs in(s, 3, 1.0);
  in.workspace.resize(in.workspace.size() - 1);
  std::vector<float> out, lse;
  try {
    in.forward(out, lse);
    FAIL() << "expected moe::Error";
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
  }
}

TEST(Attention, AttentionRejectsIndivisibleHeadGroups) {
  const AttentionShape s{1, 4, 3, 2, 4};
  EXPECT_THROW(moe::attention_workspace_elems(s), moe::Error);
}

}  // namespace

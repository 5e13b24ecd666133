// Fused LM head + cross-entropy against a naive double implementation and finite differences,
// with ignored rows and chunk sizes that do not divide the row count.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moe/core/rng.h"
#include "moe/ops/loss.h"

namespace {

using moe::f32_tensor;
using moe::i32_tensor;

std::vector<float> random_values(int64_t n, uint64_t seed, double scale = 1.0) {
  moe::Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

struct Naive {
  double loss = 0.0;
  std::vector<double> dh, dweight;  // dweight without the pre-existing accumulator
};

Naive naive_loss(const std::vector<float>& h, const std::vector<float>& w, const std::vector<int32_t>& targets,
                 int64_t R, int64_t D, int64_t V, double grad_scale) {
  Naive n{0.0, std::vector<double>(R * D, 0.0), std::vector<double>(V * D, 0.0)};
  std::vector<double> logits(V);
  for (int64_t r = 0; r < R; ++r) {
    if (targets[r] < 0) continue;
    double mx = -1e300;
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0.0;
      for (int64_t d = 0; d < D; ++d) acc += double(h[r * D + d]) * w[v * D + d];
      logits[v] = acc;
      mx = std::max(mx, acc);
    }
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[v] - mx);
    const double lse = mx + std::log(sum);
    n.loss += lse - logits[targets[r]];
    for (int64_t v = 0; v < V; ++v) {
      const double g = grad_scale * (std::exp(logits[v] - lse) - (v == targets[r] ? 1.0 : 0.0));
      for (int64_t d = 0; d < D; ++d) {
        n.dh[r * D + d] += g * w[v * D + d];
        n.dweight[v * D + d] += g * h[r * D + d];
      }
    }
  }
  return n;
}

std::vector<int32_t> targets_with_ignored(int64_t R, int64_t V, uint64_t seed) {
  moe::Rng rng(seed);
  std::vector<int32_t> t(R);
  for (int64_t r = 0; r < R; ++r) t[r] = (r % 4 == 2) ? -1 : static_cast<int32_t>(rng.below(V));
  return t;
}

// FP32 logits of D-term dot products and FP32 exponentials: loss to 1e-5 relative, gradients to
// 1e-5 relative plus 1e-6 absolute (they are O(grad_scale)), plus 1e-7 * R for dweight.
TEST(Loss, LmHeadCrossEntropyMatchesNaiveForAnyChunkSize) {
  // R, D, V; the last is large enough (chunk * V >= 2^14) to take the multi-threaded path.
  const int64_t shapes[][3] = {{13, 16, 37}, {1, 3, 2}, {30, 24, 101}, {300, 16, 101}};
  uint64_t seed = 1;
  for (const auto& s : shapes) {
    const int64_t R = s[0], D = s[1], V = s[2];
    auto h = random_values(R * D, seed++), w = random_values(V * D, seed++, 0.5);
    auto targets = targets_with_ignored(R, V, seed++);
    const float grad_scale = 0.37f;
    const Naive want = naive_loss(h, w, targets, R, D, V, grad_scale);
    for (int64_t chunk : {int64_t(1), int64_t(4), int64_t(5), R, R + 7}) {
      std::vector<float> loss(1, -1.0f), dh(R * D, 99.0f), workspace(chunk * V);
      auto dweight = random_values(V * D, seed++);  // accumulated into
      const auto dweight0 = dweight;
      moe::lm_head_cross_entropy(f32_tensor(loss.data(), {1}), f32_tensor(dh.data(), {R, D}),
                                 f32_tensor(dweight.data(), {V, D}), f32_tensor(h.data(), {R, D}),
                                 f32_tensor(w.data(), {V, D}), i32_tensor(targets.data(), {R}), grad_scale,
                                 f32_tensor(workspace.data(), {chunk, V}));
      SCOPED_TRACE(testing::Message() << "R=" << R << " D=" << D << " V=" << V << " chunk=" << chunk);
      EXPECT_NEAR(loss[0], want.loss, 1e-5 * std::fabs(want.loss));
      for (int64_t i = 0; i < R * D; ++i) {
        ASSERT_NEAR(dh[i], want.dh[i], 1e-6 + 1e-5 * std::fabs(want.dh[i])) << "dh at " << i;
        if (targets[i / D] < 0) {
          ASSERT_EQ(dh[i], 0.0f) << "ignored row " << i / D;
        }
      }
      for (int64_t i = 0; i < V * D; ++i) {
        const double expect = dweight0[i] + want.dweight[i];
        // dweight sums R rows of FP32 products: the absolute part grows with R.
        ASSERT_NEAR(dweight[i], expect, 1e-6 + 1e-7 * R + 1e-5 * std::fabs(expect)) << "dweight at " << i;
      }
    }
  }
}

TEST(Loss, LmHeadCrossEntropyLossOnlyAndPartialGradsAgree) {
  const int64_t R = 9, D = 8, V = 19, chunk = 4;
  auto h = random_values(R * D, 3), w = random_values(V * D, 4);
  auto targets = targets_with_ignored(R, V, 5);
  const Naive want = naive_loss(h, w, targets, R, D, V, 1.0);
  std::vector<float> loss(1), dh(R * D), workspace(chunk * V);
  moe::lm_head_cross_entropy(f32_tensor(loss.data(), {1}), moe::Tensor(), moe::Tensor(), f32_tensor(h.data(), {R, D}),
                             f32_tensor(w.data(), {V, D}), i32_tensor(targets.data(), {R}), 1.0f,
                             f32_tensor(workspace.data(), {chunk, V}));
  EXPECT_NEAR(loss[0], want.loss, 1e-5 * want.loss);
  moe::lm_head_cross_entropy(f32_tensor(loss.data(), {1}), f32_tensor(dh.data(), {R, D}), moe::Tensor(),
                             f32_tensor(h.data(), {R, D}), f32_tensor(w.data(), {V, D}),
                             i32_tensor(targets.data(), {R}), 1.0f, f32_tensor(workspace.data(), {chunk, V}));
  EXPECT_NEAR(loss[0], want.loss, 1e-5 * want.loss);
  for (int64_t i = 0; i < R * D; ++i) ASSERT_NEAR(dh[i], want.dh[i], 1e-6 + 1e-5 * std::fabs(want.dh[i]));
}

// loss_sum is itself the scalar; central differences with step 1e-2 on every entry of h and W
// (truncation ~1e-4; FP32 loss rounding ~1e-6 / 1e-2).
TEST(Loss, LmHeadCrossEntropyGradientsMatchFiniteDifferences) {
  const int64_t R = 5, D = 4, V = 7, chunk = 2;
  auto h = random_values(R * D, 11), w = random_values(V * D, 12);
  std::vector<int32_t> targets = {3, -1, 0, 6, 3};
  std::vector<float> workspace(chunk * V);
  auto loss = [&]() {
    std::vector<float> l(1);
    moe::lm_head_cross_entropy(f32_tensor(l.data(), {1}), moe::Tensor(), moe::Tensor(), f32_tensor(h.data(), {R, D}),
                               f32_tensor(w.data(), {V, D}), i32_tensor(targets.data(), {R}), 1.0f,
                               f32_tensor(workspace.data(), {chunk, V}));
    return double(l[0]);
  };
  std::vector<float> l(1), dh(R * D), dw(V * D, 0.0f);
  moe::lm_head_cross_entropy(f32_tensor(l.data(), {1}), f32_tensor(dh.data(), {R, D}), f32_tensor(dw.data(), {V, D}),
                             f32_tensor(h.data(), {R, D}), f32_tensor(w.data(), {V, D}),
                             i32_tensor(targets.data(), {R}), 1.0f, f32_tensor(workspace.data(), {chunk, V}));
  auto check = [&](std::vector<float>& x, const std::vector<float>& grad, const char* name) {
    for (size_t i = 0; i < x.size(); ++i) {
      const float x0 = x[i];
      x[i] = x0 + 1e-2f;
      const double lp = loss();
      const float xp = x[i];
      x[i] = x0 - 1e-2f;
      const double lm = loss();
      const float xm = x[i];
      x[i] = x0;
      const double fd = (lp - lm) / (double(xp) - xm);
      EXPECT_NEAR(grad[i], fd, 2e-3 + 1e-2 * std::fabs(fd)) << name << " at " << i;
    }
  };
  check(h, dh, "dh");
  check(w, dw, "dweight");
}

TEST(Loss, LmHeadCrossEntropyRejectsTargetOutsideVocabNamingTheRow) {
  const int64_t R = 4, D = 2, V = 5;
  std::vector<float> h(R * D), w(V * D), loss(1), workspace(2 * V);
  std::vector<int32_t> targets = {0, 1, -1, 5};
  try {
    moe::lm_head_cross_entropy(f32_tensor(loss.data(), {1}), moe::Tensor(), moe::Tensor(), f32_tensor(h.data(), {R, D}),
                               f32_tensor(w.data(), {V, D}), i32_tensor(targets.data(), {R}), 1.0f,
                               f32_tensor(workspace.data(), {2, V}));
    FAIL() << "expected moe::Error";
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("targets[3] = 5"), std::string::npos) << e.what();
  }
  targets[3] = -2;
  EXPECT_THROW(moe::lm_head_cross_entropy(f32_tensor(loss.data(), {1}), moe::Tensor(), moe::Tensor(),
                                          f32_tensor(h.data(), {R, D}), f32_tensor(w.data(), {V, D}),
                                          i32_tensor(targets.data(), {R}), 1.0f, f32_tensor(workspace.data(), {2, V})),
               moe::Error);
}

}  // namespace

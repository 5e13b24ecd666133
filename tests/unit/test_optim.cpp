// Optimizer ops against naive double implementations (torch.optim.AdamW semantics with
// torch.nn.utils.clip_grad_norm_ clipping).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "moe/core/rng.h"
#include "moe/ops/optim.h"

namespace moe {
namespace {

std::vector<float> random_vec(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

// out[0] += sum x^2: within 1e-6 relative of double for sizes spanning zero, one and several
// reduction blocks; any shape is accepted; two runs give identical bits (deterministic).
TEST(Optim, sum_squares_accumulates_into_out) {
  for (int64_t n : {0, 1, 1000, 100003, 300000}) {
    auto x = random_vec(static_cast<size_t>(n), 1 + n);
    float out = 2.5f;
    sum_squares_accumulate(f32_tensor(&out, {1}), f32_tensor(x.data(), {n}), Tensor());
    double want = 2.5;
    for (float v : x) want += double(v) * v;
    EXPECT_NEAR(out, want, 1e-6 * want) << "n=" << n;

    float again = 2.5f;
    sum_squares_accumulate(f32_tensor(&again, {1}), f32_tensor(x.data(), {1, n, 1}), Tensor());
    EXPECT_EQ(std::memcmp(&out, &again, 4), 0) << "n=" << n;
  }
  // Accumulating over several tensors equals one pass over their concatenation (within rounding).
  auto x = random_vec(5000, 9);
  float parts = 0.0f, whole = 0.0f;
  sum_squares_accumulate(f32_tensor(&parts, {1}), f32_tensor(x.data(), {2000}), Tensor());
  sum_squares_accumulate(f32_tensor(&parts, {1}), f32_tensor(x.data() + 2000, {3000}), Tensor());
  sum_squares_accumulate(f32_tensor(&whole, {1}), f32_tensor(x.data(), {5000}), Tensor());
  EXPECT_NEAR(parts, whole, 1e-6 * whole);
}

struct RefAdamW {
  std::vector<double> p, m, v;
  void step(const std::vector<float>& grad, double max_norm, const AdamWConfig& c, int step) {
    double norm_sq = 0;
    for (float g : grad) norm_sq += double(g) * g;
    const double clip = max_norm > 0 ? std::min(1.0, max_norm / (std::sqrt(norm_sq) + 1e-6)) : 1.0;
    const double bc1 = 1 - std::pow(double(c.beta1), step), bc2 = 1 - std::pow(double(c.beta2), step);
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = clip * grad[i];
      p[i] *= 1 - double(c.lr) * c.weight_decay;
      m[i] = c.beta1 * m[i] + (1 - double(c.beta1)) * g;
      v[i] = c.beta2 * v[i] + (1 - double(c.beta2)) * g * g;
      p[i] -= c.lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + c.eps);
    }
  }
};

// Three AdamW steps with the norm from sum_squares_accumulate: param within 1e-6 * (1 + |p|) of
// double, m within 1e-6 * |m| + 1e-7 (m can cancel to near zero), v within 1e-5 * |v| + 1e-12. Cases: weight decay with
// clipping active, no weight decay with a max_norm that does not clip, and clipping off
// (max_norm = 0); n = 100000 takes the OpenMP path.
TEST(Optim, adamw_matches_naive_double_over_three_steps) {
  struct Case {
    float weight_decay, max_norm;
    int64_t n;
  };
  const Case cases[] = {{0.1f, 1.0f, 1000}, {0.0f, 1e6f, 1000}, {0.1f, 0.0f, 777}, {0.05f, 2.0f, 100000}};
  uint64_t seed = 10;
  for (const auto& cs : cases) {
    SCOPED_TRACE(testing::Message() << "wd=" << cs.weight_decay << " max_norm=" << cs.max_norm << " n=" << cs.n);
    AdamWConfig cfg;
    cfg.lr = 1e-2f;
    cfg.beta1 = 0.9f;
    cfg.beta2 = 0.95f;
    cfg.eps = 1e-8f;
    cfg.weight_decay = cs.weight_decay;
    const size_t n = static_cast<size_t>(cs.n);
    auto param = random_vec(n, ++seed);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    RefAdamW ref{std::vector<double>(param.begin(), param.end()), std::vector<double>(n, 0.0),
                 std::vector<double>(n, 0.0)};
    for (int step = 1; step <= 3; ++step) {
      auto grad = random_vec(n, ++seed, 0.5);
      const auto grad_before = grad;
      float norm_sq = 0.0f;
      sum_squares_accumulate(f32_tensor(&norm_sq, {1}), f32_tensor(grad.data(), {cs.n}), Tensor());
      if (cs.max_norm == 1.0f) {
        ASSERT_GT(std::sqrt(norm_sq), 2.0f) << "this case is meant to clip";
      }
      adamw_step(f32_tensor(param.data(), {cs.n}), f32_tensor(grad.data(), {cs.n}), f32_tensor(m.data(), {cs.n}),
                 f32_tensor(v.data(), {cs.n}), f32_tensor(&norm_sq, {1}), cs.max_norm, cfg, step);
      ref.step(grad, cs.max_norm, cfg, step);
      ASSERT_EQ(std::memcmp(grad.data(), grad_before.data(), n * 4), 0) << "grad was modified";
      for (size_t i = 0; i < n; ++i) {
        ASSERT_NEAR(param[i], ref.p[i], 1e-6 * (1 + std::abs(ref.p[i]))) << "step " << step << " i " << i;
        ASSERT_NEAR(m[i], ref.m[i], 1e-6 * std::abs(ref.m[i]) + 1e-7) << "step " << step << " i " << i;
        ASSERT_NEAR(v[i], ref.v[i], 1e-5 * std::abs(ref.v[i]) + 1e-12) << "step " << step << " i " << i;
      }
    }
  }
}


// BF16 storage for the moments (optim.moment_dtype = "bf16").
std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16(x[i]);
  return out;
}
std::vector<float> widen(const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_to_f32(x[i]);
  return out;
}
Tensor bf16_tensor(std::vector<uint16_t>& x) {
  return Tensor(x.data(), DType::BF16, {static_cast<int64_t>(x.size())}, Device::CPU);
}
Tensor f32_view(std::vector<float>& x) { return f32_tensor(x.data(), {static_cast<int64_t>(x.size())}); }

// The BF16 value nearest to x (ties to even), and the spacing of BF16 values at x's magnitude.
double nearest_bf16(double x) {
  const uint16_t h = f32_to_bf16(static_cast<float>(x));  // within one BF16 step of the answer
  double best = bf16_to_f32(h);
  for (int d : {-1, 1}) {
    const uint16_t c = static_cast<uint16_t>(h + d);
    const double cv = bf16_to_f32(c);
    const double e = std::fabs(cv - x), eb = std::fabs(best - x);
    if (e < eb || (e == eb && (c & 1) == 0)) best = cv;
  }
  return best;
}
double bf16_spacing(double x) { return std::ldexp(1.0, std::ilogb(x) - 7); }

// BF16 moments are the FP32 update with what is stored rounded: from moments BF16 holds exactly,
// the param gets the bits of the FP32-moment op, and the stored m and v are that op's new moments
// rounded to nearest even, bit for bit. Four steps (the FP32 op continuing each step from the
// widened BF16 moments), weight decay and clipping active, on the serial and the OpenMP path.
TEST(Optim, adamw_with_bf16_moments_is_the_fp32_update_with_the_stored_moments_rounded) {
  for (int64_t n : {int64_t{777}, int64_t{100003}}) {
    SCOPED_TRACE(testing::Message() << "n=" << n);
    AdamWConfig cfg;
    cfg.lr = 1e-2f;
    cfg.weight_decay = 0.1f;
    auto param = random_vec(static_cast<size_t>(n), 3), param_f32 = param;
    std::vector<uint16_t> m(static_cast<size_t>(n), 0), v(static_cast<size_t>(n), 0);
    for (int step = 1; step <= 4; ++step) {
      auto grad = random_vec(static_cast<size_t>(n), 50 + step, 0.5);
      float norm_sq = 0.0f;
      sum_squares_accumulate(f32_tensor(&norm_sq, {1}), f32_view(grad), Tensor());
      ASSERT_GT(std::sqrt(norm_sq), 2.0f) << "this case is meant to clip";
      std::vector<float> m_f32 = widen(m), v_f32 = widen(v);
      adamw_step(f32_view(param_f32), f32_view(grad), f32_view(m_f32), f32_view(v_f32), f32_tensor(&norm_sq, {1}),
                 1.0f, cfg, step);
      adamw_step(f32_view(param), f32_view(grad), bf16_tensor(m), bf16_tensor(v), f32_tensor(&norm_sq, {1}), 1.0f,
                 cfg, step);
      ASSERT_EQ(std::memcmp(param.data(), param_f32.data(), param.size() * 4), 0) << "param, step " << step;
      ASSERT_EQ(m, to_bf16(m_f32)) << "exp_avg, step " << step;
      ASSERT_EQ(v, to_bf16(v_f32)) << "exp_avg_sq, step " << step;
    }
  }
}

// Five AdamW steps with BF16 moments against a double reference that stores its moments rounded
// to BF16 as the op does (bias corrections of steps 1-5, clipping active, inactive and off, weight
// decay on and off). Stated tolerances: param within 1e-6 * (1 + |p|) of the reference (the
// update uses the unrounded moments: using the stored BF16 ones would be off by ~lr * 2^-9). The
// stored m and v are the BF16 nearest to the double value, except where that value lies within
// FP32 rounding error (1e-6 of the magnitude of its two terms) of a midpoint between two BF16
// values, where either is right; at least 99% must be exactly the nearest. The reference continues
// from the stored moments.
TEST(Optim, adamw_with_bf16_moments_matches_a_double_reference_over_five_steps) {
  struct Case {
    float weight_decay, max_norm;
    int64_t n;
  };
  const Case cases[] = {{0.1f, 1.0f, 1000}, {0.0f, 1e6f, 1000}, {0.1f, 0.0f, 777}, {0.05f, 2.0f, 100000}};
  uint64_t seed = 70;
  for (const auto& cs : cases) {
    SCOPED_TRACE(testing::Message() << "wd=" << cs.weight_decay << " max_norm=" << cs.max_norm << " n=" << cs.n);
    AdamWConfig cfg;
    cfg.lr = 1e-2f;
    cfg.weight_decay = cs.weight_decay;
    const size_t n = static_cast<size_t>(cs.n);
    auto param = random_vec(n, ++seed);
    std::vector<uint16_t> m(n, 0), v(n, 0);
    std::vector<double> ref_p(param.begin(), param.end());
    for (int step = 1; step <= 5; ++step) {
      const auto grad = random_vec(n, ++seed, 0.5);
      auto grad_arg = grad;
      float norm_sq = 0.0f;
      sum_squares_accumulate(f32_tensor(&norm_sq, {1}), f32_view(grad_arg), Tensor());
      if (cs.max_norm == 1.0f) {
        ASSERT_GT(std::sqrt(norm_sq), 2.0f) << "this case is meant to clip";
      }
      const std::vector<float> m0 = widen(m), v0 = widen(v);  // what the step reads
      adamw_step(f32_view(param), f32_view(grad_arg), bf16_tensor(m), bf16_tensor(v), f32_tensor(&norm_sq, {1}),
                 cs.max_norm, cfg, step);

      double ref_norm_sq = 0;
      for (float g : grad) ref_norm_sq += double(g) * g;
      const double clip = cs.max_norm > 0 ? std::min(1.0, cs.max_norm / (std::sqrt(ref_norm_sq) + 1e-6)) : 1.0;
      const double bc1 = 1 - std::pow(double(cfg.beta1), step), bc2 = 1 - std::pow(double(cfg.beta2), step);
      int64_t not_nearest = 0;
      for (size_t i = 0; i < n; ++i) {
        const double g = clip * grad[i];
        const double mi = cfg.beta1 * double(m0[i]) + (1 - double(cfg.beta1)) * g;
        const double vi = cfg.beta2 * double(v0[i]) + (1 - double(cfg.beta2)) * g * g;
        ref_p[i] = ref_p[i] * (1 - double(cfg.lr) * cfg.weight_decay) -
                   cfg.lr * (mi / bc1) / (std::sqrt(vi / bc2) + cfg.eps);
        ASSERT_NEAR(param[i], ref_p[i], 1e-6 * (1 + std::abs(ref_p[i]))) << "step " << step << " i " << i;
        // FP32 rounding error of the new moment: relative to its terms (m may cancel to near zero).
        const double m_terms = std::fabs(cfg.beta1 * double(m0[i])) + std::fabs((1 - double(cfg.beta1)) * g);
        for (const auto& [stored, exact, terms, what] : {std::tuple{bf16_to_f32(m[i]), mi, m_terms, "exp_avg"},
                                                         std::tuple{bf16_to_f32(v[i]), vi, vi, "exp_avg_sq"}}) {
          ASSERT_LE(std::fabs(stored - exact), 0.5 * bf16_spacing(exact) + 1e-6 * terms)
              << what << " is not a rounding of " << exact << ": " << stored << ", step " << step << " i " << i;
          not_nearest += double(stored) != nearest_bf16(exact) ? 1 : 0;
        }
      }
      EXPECT_LE(not_nearest, static_cast<int64_t>(2 * n) / 100) << "step " << step;
    }
  }
}

// A non-finite squared norm (inf or NaN) skips the step: param, m and v (F32 or BF16) keep every bit.
TEST(Optim, adamw_skips_non_finite_norm) {
  const int64_t n = 500;
  AdamWConfig cfg;
  cfg.weight_decay = 0.1f;
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                    -std::numeric_limits<float>::infinity()})
    for (float max_norm : {0.0f, 1.0f}) {
      auto param = random_vec(n, 1), grad = random_vec(n, 2), m = random_vec(n, 3), v = random_vec(n, 4);
      for (auto& x : v) x = std::abs(x);
      grad[7] = std::numeric_limits<float>::quiet_NaN();
      const auto p0 = param, m0 = m, v0 = v;
      float norm_sq = bad;
      adamw_step(f32_tensor(param.data(), {n}), f32_tensor(grad.data(), {n}), f32_tensor(m.data(), {n}),
                 f32_tensor(v.data(), {n}), f32_tensor(&norm_sq, {1}), max_norm, cfg, 5);
      EXPECT_EQ(std::memcmp(param.data(), p0.data(), n * 4), 0) << "norm_sq=" << bad;
      EXPECT_EQ(std::memcmp(m.data(), m0.data(), n * 4), 0) << "norm_sq=" << bad;
      EXPECT_EQ(std::memcmp(v.data(), v0.data(), n * 4), 0) << "norm_sq=" << bad;

      auto m_bf16 = to_bf16(m0), v_bf16 = to_bf16(v0);
      const auto m_bf16_0 = m_bf16, v_bf16_0 = v_bf16;
      adamw_step(f32_tensor(param.data(), {n}), f32_tensor(grad.data(), {n}), bf16_tensor(m_bf16),
                 bf16_tensor(v_bf16), f32_tensor(&norm_sq, {1}), max_norm, cfg, 5);
      EXPECT_EQ(std::memcmp(param.data(), p0.data(), n * 4), 0) << "BF16 moments, norm_sq=" << bad;
      EXPECT_EQ(m_bf16, m_bf16_0) << "BF16 moments, norm_sq=" << bad;
      EXPECT_EQ(v_bf16, v_bf16_0) << "BF16 moments, norm_sq=" << bad;
    }
}

// Moments are both F32 or both BF16: another dtype, or one of each, is refused naming the tensor.
TEST(Optim, adamw_refuses_moments_of_another_or_mixed_dtype) {
  std::vector<float> p(10), g(10), m(10), v(10);
  std::vector<uint16_t> m_bf16(10), v_bf16(10);
  std::vector<int32_t> m_i32(10);
  float norm_sq = 1.0f;
  auto call = [&](Tensor mt, Tensor vt) {
    try {
      adamw_step(f32_view(p), f32_view(g), mt, vt, f32_tensor(&norm_sq, {1}), 1.0f, AdamWConfig{}, 1);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(call(bf16_tensor(m_bf16), f32_view(v)).find("v has dtype F32 but m has BF16"), std::string::npos)
      << call(bf16_tensor(m_bf16), f32_view(v));
  EXPECT_NE(call(f32_view(m), bf16_tensor(v_bf16)).find("v has dtype BF16 but m has F32"), std::string::npos);
  EXPECT_NE(call(i32_tensor(m_i32.data(), {10}), f32_view(v)).find("m must be F32 (moments are F32 or BF16)"),
            std::string::npos)
      << call(i32_tensor(m_i32.data(), {10}), f32_view(v));
  EXPECT_EQ(call(bf16_tensor(m_bf16), bf16_tensor(v_bf16)), "");
}

TEST(Optim, adamw_rejects_mismatched_shapes_and_bad_step) {
  std::vector<float> p(10), g(10), m(10), v(9);
  float norm_sq = 1.0f;
  auto call = [&](Tensor vt, int64_t step) {
    adamw_step(f32_tensor(p.data(), {10}), f32_tensor(g.data(), {10}), f32_tensor(m.data(), {10}), vt,
               f32_tensor(&norm_sq, {1}), 1.0f, AdamWConfig{}, step);
  };
  EXPECT_THROW(call(f32_tensor(v.data(), {9}), 1), Error);
  v.resize(10);
  EXPECT_THROW(call(f32_tensor(v.data(), {10}), 0), Error);
  EXPECT_NO_THROW(call(f32_tensor(v.data(), {10}), 1));
}

// lr and step from a schedule tensor give the same bits as cfg.lr and `step` (whatever cfg.lr and
// `step` then say): five steps with a changing lr, with and without weight decay and clipping.
TEST(Optim, adamw_with_schedule_equals_adamw_without_bit_for_bit) {
  const int64_t n = 100000;  // the OpenMP path
  for (float weight_decay : {0.0f, 0.1f}) {
    SCOPED_TRACE(testing::Message() << "wd=" << weight_decay);
    AdamWConfig cfg;
    cfg.weight_decay = weight_decay;
    auto param = random_vec(n, 1), m = std::vector<float>(n, 0.0f), v = std::vector<float>(n, 0.0f);
    auto param_s = param, m_s = m, v_s = v;
    for (int step = 1; step <= 5; ++step) {
      auto grad = random_vec(n, 10 + step, 0.01);
      float norm_sq = 0.0f;
      sum_squares_accumulate(f32_tensor(&norm_sq, {1}), f32_tensor(grad.data(), {n}), Tensor());
      cfg.lr = 3e-4f * static_cast<float>(step) / 5.0f;  // a warmup
      adamw_step(f32_tensor(param.data(), {n}), f32_tensor(grad.data(), {n}), f32_tensor(m.data(), {n}),
                 f32_tensor(v.data(), {n}), f32_tensor(&norm_sq, {1}), 1.0f, cfg, step);
      float schedule[2] = {cfg.lr, static_cast<float>(step)};
      AdamWConfig ignored_lr = cfg;
      ignored_lr.lr = 123.0f;
      adamw_step(f32_tensor(param_s.data(), {n}), f32_tensor(grad.data(), {n}), f32_tensor(m_s.data(), {n}),
                 f32_tensor(v_s.data(), {n}), f32_tensor(&norm_sq, {1}), 1.0f, ignored_lr, /*step=*/0, {},
                 f32_tensor(schedule, {2}));
      ASSERT_EQ(std::memcmp(param.data(), param_s.data(), n * 4), 0) << "param, step " << step;
      ASSERT_EQ(std::memcmp(m.data(), m_s.data(), n * 4), 0) << "m, step " << step;
      ASSERT_EQ(std::memcmp(v.data(), v_s.data(), n * 4), 0) << "v, step " << step;
    }
  }
}

TEST(Optim, adamw_rejects_a_bad_schedule) {
  std::vector<float> p(10), g(10), m(10), v(10);
  float norm_sq = 1.0f;
  auto call = [&](Tensor schedule) {
    adamw_step(f32_tensor(p.data(), {10}), f32_tensor(g.data(), {10}), f32_tensor(m.data(), {10}),
               f32_tensor(v.data(), {10}), f32_tensor(&norm_sq, {1}), 1.0f, AdamWConfig{}, 1, {}, schedule);
  };
  float three[3] = {1e-3f, 1.0f, 0.0f};
  int32_t ints[2] = {1, 1};
  EXPECT_THROW(call(f32_tensor(three, {3})), Error);  // not [2]
  EXPECT_THROW(call(i32_tensor(ints, {2})), Error);   // not F32
  for (float bad_step :
       {0.0f, -1.0f, 2.5f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    float schedule[2] = {1e-3f, bad_step};
    EXPECT_THROW(call(f32_tensor(schedule, {2})), Error) << "step " << bad_step;
  }
  float good[2] = {1e-3f, 7.0f};
  EXPECT_NO_THROW(call(f32_tensor(good, {2})));
}

// param_bf16: the updated param rounded to BF16 (round to nearest even), written in the same pass;
// the FP32 results are those of the call without it; a skipped step leaves the copy untouched; a
// copy of another dtype or size is refused.
TEST(Optim, adamw_writes_the_bf16_copy_of_the_updated_param) {
  const int64_t n = 100003;
  AdamWConfig cfg;
  cfg.weight_decay = 0.1f;
  auto param = random_vec(n, 1), grad = random_vec(n, 2, 0.01);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  auto param2 = param, m2 = m, v2 = v;
  std::vector<uint16_t> copy(n, 0xffff);
  float norm_sq = 4.0f;
  auto t = [](std::vector<float>& x) { return f32_tensor(x.data(), {static_cast<int64_t>(x.size())}); };
  const Tensor copy_t(copy.data(), DType::BF16, {n}, Device::CPU);
  adamw_step(t(param), t(grad), t(m), t(v), f32_tensor(&norm_sq, {1}), 1.0f, cfg, 1, {}, {}, copy_t);
  adamw_step(t(param2), t(grad), t(m2), t(v2), f32_tensor(&norm_sq, {1}), 1.0f, cfg, 1);
  ASSERT_EQ(std::memcmp(param.data(), param2.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(m.data(), m2.data(), n * 4), 0);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(copy[i], f32_to_bf16(param[i])) << "element " << i;
  EXPECT_NE(f32_to_bf16(param[0]), f32_to_bf16(random_vec(1, 1)[0]));  // the copy is of the new value

  const auto before = copy;
  float bad = std::numeric_limits<float>::quiet_NaN();
  adamw_step(t(param), t(grad), t(m), t(v), f32_tensor(&bad, {1}), 1.0f, cfg, 2, {}, {}, copy_t);
  EXPECT_EQ(before, copy) << "a skipped step wrote the copy";

  std::vector<float> f32_copy(n);
  EXPECT_THROW(adamw_step(t(param), t(grad), t(m), t(v), f32_tensor(&norm_sq, {1}), 1.0f, cfg, 2, {}, {},
                          t(f32_copy)),
               Error);
  EXPECT_THROW(adamw_step(t(param), t(grad), t(m), t(v), f32_tensor(&norm_sq, {1}), 1.0f, cfg, 2, {}, {},
                          Tensor(copy.data(), DType::BF16, {n - 1}, Device::CPU)),
               Error);
}

}  // namespace
}  // namespace moe

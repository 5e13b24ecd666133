// CUDA router ops against the CPU router on fresh random inputs: T in {1, 37, 4096}, N in {8, 64,
// 128} (and 256, the CUDA limit), K in {1, 2, 8, N}, softmax and sigmoid, normalize on and off,
// with and without the selection bias, ties, and two runs bit-identical. synthetic_routing must
// equal the CPU exactly (integer ids, weights 1/K).
//
// Inputs and tolerances:
//   - logits are random multiples of 1/16 in [-4, 4]: equal logits give exactly equal scores on
//     both devices (ties), and distinct ones differ by far more than rounding, so topk_idx must
//     equal the CPU's exactly. With a bias, a token whose CPU keys (score + bias) of two experts
//     come within 1e-6 (relative to their |score| + |bias|) without being an exact tie of equal
//     inputs is left out of the exact comparison (rounding may order it either way); at most
//     1% (+2) of the tokens may be.
//   - scores, topk_weight: normalized error <= 1e-6 (both round exp from double; sums differ in order).
//   - lb_loss, z_loss: relative error <= 1e-5 (double sums in another order, rounded to FP32).
//   - dlogits: normalized error <= 1e-5 (the softmax dot product sums in another order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/rng.h"
#include "moe/ops/route.h"
#include "moe/ops/router.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;
using testing::normalized_error;

// n random multiples of `step` in [-range, range].
std::vector<float> grid_values(size_t n, uint64_t seed, float step, int range_steps) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = step * static_cast<float>(static_cast<int>(rng.below(2 * range_steps + 1)) - range_steps);
  return v;
}

std::vector<float> normal_values(size_t n, uint64_t seed, double scale) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const char* fn_name(ScoreFn fn) { return fn == ScoreFn::Softmax ? "softmax" : "sigmoid"; }

struct CpuRouter {
  std::vector<float> scores, weights;
  std::vector<int32_t> idx;
};

CpuRouter cpu_forward(const std::vector<float>& logits, const std::vector<float>& bias, int T, int N, int K,
                      ScoreFn fn, bool normalize) {
  CpuRouter r;
  r.scores.resize(static_cast<size_t>(T) * N);
  r.weights.resize(static_cast<size_t>(T) * K);
  r.idx.resize(static_cast<size_t>(T) * K);
  std::vector<float> l = logits, b = bias;
  router_forward(f32_tensor(r.scores.data(), {T, N}), i32_tensor(r.idx.data(), {T, K}),
                 f32_tensor(r.weights.data(), {T, K}), f32_tensor(l.data(), {T, N}),
                 b.empty() ? Tensor() : f32_tensor(b.data(), {N}), fn, normalize);
  return r;
}

// Tokens whose selection keys (CPU scores + bias) contain two experts within 1e-6 (relative) of
// each other (relative to |score| + |bias| of both) that are not an exact tie of equal inputs
// (equal logit and equal bias).
std::vector<bool> near_tie_tokens(const CpuRouter& cpu, const std::vector<float>& logits,
                                  const std::vector<float>& bias, int T, int N) {
  std::vector<bool> near(static_cast<size_t>(T), false);
  if (bias.empty()) return near;
  std::vector<int> order(static_cast<size_t>(N));
  for (int t = 0; t < T; ++t) {
    const auto key = [&](int e) { return cpu.scores[static_cast<size_t>(t) * N + e] + bias[e]; };
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return key(a) < key(b); });
    for (int i = 1; i < N; ++i) {
      const int a = order[i - 1], b = order[i];
      const bool same_inputs = logits[static_cast<size_t>(t) * N + a] == logits[static_cast<size_t>(t) * N + b] &&
                               bias[a] == bias[b];
      // Relative to the terms of the sums, so keys near zero (score and bias cancelling) count too.
      const float scale = std::fabs(cpu.scores[static_cast<size_t>(t) * N + a]) + std::fabs(bias[a]) +
                          std::fabs(cpu.scores[static_cast<size_t>(t) * N + b]) + std::fabs(bias[b]);
      if (!same_inputs && std::fabs(key(b) - key(a)) <= 1e-6f * scale) near[t] = true;
    }
  }
  return near;
}

// router_forward on the GPU (twice) against the CPU for one case.
void check_forward(int T, int N, int K, ScoreFn fn, bool normalize, bool with_bias, uint64_t seed,
                   std::vector<float> logits = {}) {
  SCOPED_TRACE(::testing::Message() << "T=" << T << " N=" << N << " K=" << K << " " << fn_name(fn)
                                    << " normalize=" << normalize << " bias=" << with_bias);
  if (logits.empty()) logits = grid_values(static_cast<size_t>(T) * N, seed, 1.0f / 16, 64);
  const std::vector<float> bias = with_bias ? grid_values(N, seed + 1, 1.0f / 64, 16) : std::vector<float>{};
  const CpuRouter cpu = cpu_forward(logits, bias, T, N, K, fn, normalize);

  DeviceBuffer logits_d(DType::F32, {T, N}), bias_d(DType::F32, {N});
  logits_d.upload(logits);
  if (with_bias) bias_d.upload(bias);
  std::vector<float> first_scores, first_weights;
  std::vector<int32_t> first_idx;
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer scores_d(DType::F32, {T, N}), idx_d(DType::I32, {T, K}), weights_d(DType::F32, {T, K});
    router_forward(scores_d, idx_d, weights_d, logits_d, with_bias ? bias_d.tensor() : Tensor(), fn, normalize);
    const std::vector<float> scores = scores_d.download(), weights = weights_d.download();
    const std::vector<int32_t> idx = idx_d.download_i32();
    if (run == 1) {
      EXPECT_TRUE(bits_equal(scores, first_scores)) << "scores differ between two runs";
      EXPECT_TRUE(bits_equal(weights, first_weights)) << "topk_weight differs between two runs";
      EXPECT_EQ(idx, first_idx) << "topk_idx differs between two runs";
      break;
    }
    first_scores = scores;
    first_weights = weights;
    first_idx = idx;

    EXPECT_LE(normalized_error(scores, cpu.scores), 1e-6);
    const std::vector<bool> near = near_tie_tokens(cpu, logits, bias, T, N);
    const int skipped = static_cast<int>(std::count(near.begin(), near.end(), true));
    if (!with_bias) {
      EXPECT_EQ(skipped, 0) << "grid logits without a bias cannot have near ties";
    }
    EXPECT_LE(skipped, T / 100 + 2) << "too many tokens with near ties for an exact comparison";
    std::vector<float> w_gpu, w_cpu;
    int mismatches = 0;
    for (int t = 0; t < T; ++t) {
      if (near[t]) continue;
      for (int k = 0; k < K; ++k) {
        const size_t i = static_cast<size_t>(t) * K + k;
        if (idx[i] != cpu.idx[i] && ++mismatches <= 5)
          ADD_FAILURE() << "topk_idx[" << t << ", " << k << "] = " << idx[i] << ", CPU " << cpu.idx[i];
        w_gpu.push_back(weights[i]);
        w_cpu.push_back(cpu.weights[i]);
      }
    }
    EXPECT_EQ(mismatches, 0);
    EXPECT_LE(normalized_error(w_gpu, w_cpu), 1e-6);
  }
}
#endif

TEST(CudaRouter, ForwardMatchesCpuOverShapesScoreFnsNormalizeAndBias) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  uint64_t seed = 100;
  for (int T : {1, 37, 4096})
    for (int N : {8, 64, 128})
      for (int K : {1, 2, 8, N}) {
        if (K > N || (K == N && K == 8)) continue;  // K = 8 = N appears once
        for (ScoreFn fn : {ScoreFn::Softmax, ScoreFn::Sigmoid})
          for (bool normalize : {false, true})
            for (bool with_bias : {false, true}) check_forward(T, N, K, fn, normalize, with_bias, ++seed);
      }
#endif
}

TEST(CudaRouter, ForwardMatchesCpuWith256Experts) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  for (int K : {1, 8, 256})
    for (ScoreFn fn : {ScoreFn::Softmax, ScoreFn::Sigmoid}) check_forward(37, 256, K, fn, true, true, 7 + K);
#endif
}

TEST(CudaRouter, ForwardTiesGoToTheLowerExpert) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  // Token 0: all logits equal; token 1: equal pairs (e and e+1 share a value); token 2: a few
  // distinct values repeated; the rest random on a coarse grid (many ties).
  const int T = 64, N = 64;
  std::vector<float> logits = grid_values(static_cast<size_t>(T) * N, 5, 0.5f, 2);
  for (int e = 0; e < N; ++e) {
    logits[e] = 0.25f;
    logits[N + e] = static_cast<float>(e / 2) * 0.125f;
    logits[2 * N + e] = static_cast<float>(e % 3);
  }
  for (int K : {1, 2, 8, 64})
    for (ScoreFn fn : {ScoreFn::Softmax, ScoreFn::Sigmoid})
      for (bool with_bias : {false, true}) check_forward(T, N, K, fn, true, with_bias, 11, logits);

  // All equal: the selection is experts 0..K-1 in order.
  DeviceBuffer logits_d(DType::F32, {1, N}), scores_d(DType::F32, {1, N}), idx_d(DType::I32, {1, 8}),
      weights_d(DType::F32, {1, 8});
  logits_d.upload(std::vector<float>(N, 1.5f));
  router_forward(scores_d, idx_d, weights_d, logits_d, Tensor(), ScoreFn::Softmax, true);
  EXPECT_EQ(idx_d.download_i32(), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(weights_d.download(), std::vector<float>(8, 0.125f));
#endif
}

TEST(CudaRouter, ForwardRejectsMoreExpertsThanItSupports) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer logits_d(DType::F32, {2, 257}), scores_d(DType::F32, {2, 257}), idx_d(DType::I32, {2, 2}),
      weights_d(DType::F32, {2, 2});
  try {
    router_forward(scores_d, idx_d, weights_d, logits_d, Tensor(), ScoreFn::Softmax, true);
    FAIL() << "N = 257 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
  }
#endif
}

TEST(CudaRouter, LossesMatchCpuAndAreDeterministic) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  uint64_t seed = 300;
  for (int T : {1, 37, 4096, 20000})
    for (int N : {8, 64, 128})
      for (int K : {1, 2, 8}) {
        if (K >= N) continue;  // K < N, so expert 0 (logit -30) gets no route
        for (ScoreFn fn : {ScoreFn::Softmax, ScoreFn::Sigmoid}) {
          SCOPED_TRACE(::testing::Message() << "T=" << T << " N=" << N << " K=" << K << " " << fn_name(fn));
          std::vector<float> logits = normal_values(static_cast<size_t>(T) * N, ++seed, 2.0);
          for (int t = 0; t < T; ++t) logits[static_cast<size_t>(t) * N] = -30.0f;  // expert 0: no routes
          const CpuRouter cpu = cpu_forward(logits, {}, T, N, K, fn, true);
          std::vector<int32_t> counts(N), idx = cpu.idx;
          route_counts(i32_tensor(counts.data(), {N}), i32_tensor(idx.data(), {T, K}));
          ASSERT_EQ(counts[0], 0);
          float lb_ref = 0, z_ref = 0;
          std::vector<float> s = cpu.scores, l = logits;
          router_losses(f32_tensor(&lb_ref, {1}), f32_tensor(&z_ref, {1}), i32_tensor(counts.data(), {N}),
                        f32_tensor(s.data(), {T, N}), f32_tensor(l.data(), {T, N}), K, Tensor());

          DeviceBuffer logits_d(DType::F32, {T, N}), scores_d(DType::F32, {T, N}), counts_d(DType::I32, {N});
          logits_d.upload(logits);
          scores_d.upload(cpu.scores);
          counts_d.upload_i32(counts);
          DeviceBuffer ws_d(DType::F32, {router_losses_workspace_elems(Device::CUDA, T, N)});
          std::vector<float> first;
          for (int run = 0; run < 2; ++run) {
            DeviceBuffer lb_d(DType::F32, {1}), z_d(DType::F32, {1});
            router_losses(lb_d, z_d, counts_d, scores_d, logits_d, K, ws_d);
            const std::vector<float> got = {lb_d.download()[0], z_d.download()[0]};
            if (run == 0) {
              EXPECT_NEAR(got[0], lb_ref, 1e-5 * std::fabs(lb_ref)) << "lb_loss";
              EXPECT_NEAR(got[1], z_ref, 1e-5 * std::fabs(z_ref)) << "z_loss";
              first = got;
            } else {
              EXPECT_TRUE(bits_equal(got, first)) << "losses differ between two runs";
            }
          }
        }
      }
#endif
}

#if defined(MOE_HAVE_CUDA)
// One router_losses call's inputs, outputs and workspace on the device.
struct LossCall {
  LossCall(int64_t T, int64_t N, int top_k, uint64_t seed)
      : K(top_k),
        logits(DType::F32, {T, N}),
        scores(DType::F32, {T, N}),
        counts(DType::I32, {N}),
        lb(DType::F32, {1}),
        z(DType::F32, {1}),
        workspace(DType::F32, {router_losses_workspace_elems(Device::CUDA, T, N)}) {
    logits.upload(grid_values(static_cast<size_t>(T * N), seed, 1.0f / 16, 64));
    std::vector<float> s = normal_values(static_cast<size_t>(T * N), seed + 1, 1.0);
    for (float& x : s) x = std::fabs(x);  // the reduction only needs some values
    scores.upload(s);
    std::vector<int32_t> c(static_cast<size_t>(N));
    for (int64_t e = 0; e < N; ++e) c[static_cast<size_t>(e)] = static_cast<int32_t>((e * 7 + seed) % 50);
    counts.upload_i32(c);
  }
  void run(Stream stream) { router_losses(lb, z, counts, scores, logits, K, workspace, stream); }
  std::vector<float> result() const { return {lb.download()[0], z.download()[0]}; }

  int K;
  DeviceBuffer logits, scores, counts, lb, z, workspace;
};
#endif

// Two router_losses calls running at once on two streams, each with its own workspace, give the
// bits of the same calls made one after the other: the partial sums live in the caller's
// workspace, not in a buffer the calls share. Different T give different block splits, so calls
// that shared partials would mix each other's sums.
TEST(CudaRouter, LossesOnTwoStreamsWithTheirOwnWorkspacesMatchSerialCalls) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  LossCall a(4096, 64, 4, 1), b(3001, 64, 4, 2);
  a.run({});
  b.run({});
  const std::vector<float> a_serial = a.result(), b_serial = b.result();
  cudaStream_t s1 = nullptr, s2 = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  for (int rep = 0; rep < 50; ++rep) {
    a.run(Stream{s1});
    b.run(Stream{s2});
  }
  CUDA_CHECK(cudaStreamSynchronize(s1));
  CUDA_CHECK(cudaStreamSynchronize(s2));
  EXPECT_TRUE(bits_equal(a.result(), a_serial)) << "the call on stream 1 saw the other call's partial sums";
  EXPECT_TRUE(bits_equal(b.result(), b_serial)) << "the call on stream 2 saw the other call's partial sums";
  CUDA_CHECK(cudaStreamDestroy(s1));
  CUDA_CHECK(cudaStreamDestroy(s2));
#endif
}

TEST(CudaRouter, BackwardMatchesCpuAndIsDeterministic) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  uint64_t seed = 500;
  for (int T : {1, 37, 4096})
    for (int N : {8, 64, 128})
      for (int K : {1, 2, 8, N}) {
        if (K > N || (K == N && K == 8)) continue;
        for (ScoreFn fn : {ScoreFn::Softmax, ScoreFn::Sigmoid})
          for (bool normalize : {false, true})
            for (float z_scale : {0.0f, 1e-3f}) {
              SCOPED_TRACE(::testing::Message() << "T=" << T << " N=" << N << " K=" << K << " " << fn_name(fn)
                                                << " normalize=" << normalize << " z_scale=" << z_scale);
              const float lb_scale = 0.01f;
              std::vector<float> logits = grid_values(static_cast<size_t>(T) * N, ++seed, 1.0f / 16, 64);
              const CpuRouter cpu = cpu_forward(logits, {}, T, N, K, fn, normalize);
              std::vector<int32_t> counts(N), idx = cpu.idx;
              route_counts(i32_tensor(counts.data(), {N}), i32_tensor(idx.data(), {T, K}));
              std::vector<float> dw = normal_values(static_cast<size_t>(T) * K, ++seed, 1.0);
              std::vector<float> w = cpu.weights, s = cpu.scores, dl_ref(static_cast<size_t>(T) * N);
              router_backward(f32_tensor(dl_ref.data(), {T, N}), f32_tensor(dw.data(), {T, K}),
                              i32_tensor(idx.data(), {T, K}), f32_tensor(w.data(), {T, K}),
                              f32_tensor(s.data(), {T, N}), f32_tensor(logits.data(), {T, N}),
                              i32_tensor(counts.data(), {N}), lb_scale, z_scale, fn, normalize);

              DeviceBuffer dw_d(DType::F32, {T, K}), idx_d(DType::I32, {T, K}), w_d(DType::F32, {T, K}),
                  s_d(DType::F32, {T, N}), l_d(DType::F32, {T, N}), counts_d(DType::I32, {N});
              dw_d.upload(dw);
              idx_d.upload_i32(cpu.idx);
              w_d.upload(cpu.weights);
              s_d.upload(cpu.scores);
              l_d.upload(logits);
              counts_d.upload_i32(counts);
              std::vector<float> first;
              for (int run = 0; run < 2; ++run) {
                DeviceBuffer dl_d(DType::F32, {T, N});
                router_backward(dl_d, dw_d, idx_d, w_d, s_d, l_d, counts_d, lb_scale, z_scale, fn, normalize);
                const std::vector<float> dl = dl_d.download();
                if (run == 0) {
                  EXPECT_LE(normalized_error(dl, dl_ref), 1e-5);
                  first = dl;
                } else {
                  EXPECT_TRUE(bits_equal(dl, first)) << "dlogits differ between two runs";
                }
              }
            }
      }
#endif
}

#if defined(MOE_HAVE_CUDA)
// synthetic_routing on the CPU and (into poisoned buffers) on the GPU: ids and weight bits equal.
void check_synthetic_routing(int64_t T, int64_t N, int64_t K, bool random, uint64_t seed, int64_t layer) {
  SCOPED_TRACE(::testing::Message() << "T " << T << " N " << N << " K " << K << " random " << random << " seed " << seed
                                    << " layer " << layer);
  const size_t n = static_cast<size_t>(T * K);
  std::vector<int32_t> idx(n);
  std::vector<float> weights(n);
  synthetic_routing(i32_tensor(idx.data(), {T, K}), f32_tensor(weights.data(), {T, K}), random, N, seed, layer);
  DeviceBuffer idx_d(DType::I32, {T, K}), weights_d(DType::F32, {T, K});  // poisoned: -1 and NaN
  synthetic_routing(idx_d, weights_d, random, N, seed, layer);
  const std::vector<int32_t> got = idx_d.download_i32();
  int mismatches = 0;
  for (size_t i = 0; i < n; ++i)
    if (got[i] != idx[i] && ++mismatches <= 5)
      ADD_FAILURE() << "topk_idx[" << i / K << ", " << i % K << "] = " << got[i] << ", CPU " << idx[i];
  EXPECT_EQ(mismatches, 0);
  EXPECT_TRUE(bits_equal(weights_d.download(), weights)) << "topk_weight";
}
#endif

// Both benchmark routings equal the CPU op exactly: the kernel replays the host's Rng draws bit for
// bit. Shapes include one token, K = N (many redraws), N above the router's 256 limit, and T past
// the kernel's grid cap (65536 blocks of 256 threads), where threads take several tokens.
TEST(CudaRouter, SyntheticRoutingMatchesCpuExactly) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  const int64_t shapes[][3] = {{1, 1, 1},     {1, 8, 8},       {37, 8, 2},     {100, 16, 16},
                               {4096, 64, 8}, {300, 128, 128}, {513, 1000, 7}, {2000, 300, 300}};
  for (const auto& s : shapes)
    for (bool random : {false, true})
      for (uint64_t seed : {uint64_t{0}, uint64_t{0x9e3779b97f4a7c15ull}})
        for (int64_t layer : {int64_t{0}, int64_t{5}}) check_synthetic_routing(s[0], s[1], s[2], random, seed, layer);
  const int64_t many_tokens = int64_t{65536} * 256 + 37;
  check_synthetic_routing(many_tokens, 64, 2, false, 1, 0);
  check_synthetic_routing(many_tokens, 64, 2, true, 1, 0);
#endif
}

TEST(CudaRouter, SyntheticRoutingRejectsImpossibleOrMixedInputs) {
  MOE_SKIP_WITHOUT_GPU();
#if defined(MOE_HAVE_CUDA)
  DeviceBuffer idx_d(DType::I32, {4, 3}), weights_d(DType::F32, {4, 3}), weights_34(DType::F32, {3, 4});
  std::vector<float> weights_host(12);
  EXPECT_NO_THROW(synthetic_routing(idx_d, weights_d, true, 3, 1, 0));       // K = N
  EXPECT_THROW(synthetic_routing(idx_d, weights_d, true, 2, 1, 0), Error);   // K > N
  EXPECT_THROW(synthetic_routing(idx_d, weights_d, false, 0, 1, 0), Error);  // no experts
  EXPECT_THROW(synthetic_routing(idx_d, weights_34, true, 8, 1, 0), Error);  // weight shape
  EXPECT_THROW(synthetic_routing(idx_d, f32_tensor(weights_host.data(), {4, 3}), true, 8, 1, 0), Error);  // host
  EXPECT_THROW(synthetic_routing(weights_d, weights_d, true, 8, 1, 0), Error);                            // idx dtype
#endif
}

}  // namespace
}  // namespace moe

// Skips for the GPU tests: where this binary or machine cannot run CUDA (or NCCL), the test is
// skipped with the reason printed, so CI without a GPU stays green and says why.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "moe/comm/nccl_communicator.h"
#include "moe/core/device.h"
#include "moe/train/trainer.h"

#define MOE_SKIP_WITHOUT_GPU()                                       \
  do {                                                               \
    std::string moe_why_;                                            \
    if (!::moe::cuda_available(&moe_why_)) GTEST_SKIP() << moe_why_; \
  } while (0)

#define MOE_SKIP_WITHOUT_NCCL()                                      \
  do {                                                               \
    std::string moe_why_;                                            \
    if (!::moe::cuda_available(&moe_why_)) GTEST_SKIP() << moe_why_; \
    if (!::moe::nccl_available(&moe_why_)) GTEST_SKIP() << moe_why_; \
  } while (0)

namespace moe::testing {

// ||a - ref|| / ||ref|| (||a - ref|| where ref is zero): how the GPU tests bound two runs whose
// kernels are not bitwise deterministic.
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// train.deterministic: run b repeats run a bit for bit, every step's loss and gradient norm
// (`what` names b in the failure).
inline void expect_same_steps_bit_for_bit(const TrainSummary& a, const TrainSummary& b, const char* what) {
  ASSERT_EQ(b.steps.size(), a.steps.size()) << what;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(b.steps[i].loss, a.steps[i].loss) << what << ", step " << i + 1;
    EXPECT_EQ(b.steps[i].grad_norm, a.steps[i].grad_norm) << what << ", step " << i + 1;
  }
}

// train.deterministic: two eager runs of config(extra) and one captured as a CUDA graph repeat
// the first bit for bit over `steps` steps (`config` builds the test's config from extra settings).
inline void expect_deterministic_runs_repeat(const std::function<Config(std::vector<std::string>)>& config,
                                             const TrainOptions& opts, Communicator& world, int64_t steps) {
  const std::vector<std::string> det = {"train.steps=" + std::to_string(steps), "train.deterministic=true"};
  std::vector<std::string> det_graph = det;
  det_graph.push_back("train.cuda_graph=true");
  Trainer eager_a(config(det), opts, world);
  Trainer eager_b(config(det), opts, world);
  Trainer graph(config(det_graph), opts, world);
  const TrainSummary a = eager_a.run(), b = eager_b.run(), c = graph.run();
  ASSERT_EQ(a.steps.size(), static_cast<size_t>(steps));
  EXPECT_GT(c.graph_nodes, 0u) << "the step was not captured";
  expect_same_steps_bit_for_bit(a, b, "a second eager run");
  expect_same_steps_bit_for_bit(a, c, "the replayed graph");
}

}  // namespace moe::testing

// ranks: 2 4
// Selective activation recompute under expert parallelism: with ep = 2 and ep = world, rowwise
// and alltoall dispatch, every recompute mode gives each rank's reduced gradients (the pieces it
// holds) of the no-recompute run of the same topology bit for bit, in 2 optimizer steps of 2
// microbatches per rank, and the same losses. Block recompute re-dispatches every MoE layer's
// rows collectively in backward into the shared recompute pair, so this also checks that the
// ranks' re-dispatches line up and that the pair's rows are never read while a peer rewrites them.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "job_temp_dir_test.h"
#include "../train/trainer_test_util.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

std::vector<std::string> base_overrides(const std::string& run_dir, int world) {
  std::vector<std::string> o = testing::tiny_moe_cpu_run(world, /*steps=*/2);
  o.push_back("run.dir=\"" + run_dir + "\"");
  return o;
}

struct RunResult {
  // This rank's reduced gradient pieces of each step, by name (elements it does not hold are NaN).
  std::vector<std::map<std::string, std::vector<float>>> grads;
  std::vector<double> losses;
  double dropped_fraction = 0;  // of the first step
};

RunResult run(Communicator& world, const std::vector<std::string>& overrides) {
  const Config cfg = load_config("tiny", overrides);
  RunResult out;
  Trainer t(cfg, testing::quiet_bench(), world);
  for (int64_t step = 0; step < cfg.train.steps; ++step) {
    out.grads.push_back(testing::step_gradients(t, step, std::nanf("")));
    const StepRecord r = t.train_step(step);
    out.losses.push_back(r.loss);
    if (step == 0) out.dropped_fraction = r.dropped_fraction;
  }
  return out;
}

class RecomputeUnderEp : public testing::JobTempDirTest {
 protected:
  // Every recompute mode against none, for each EP degree and backend this job can run.
  // Returns the reference's first-step drop fraction (the largest over the topologies).
  double expect_every_mode_matches(const std::vector<std::string>& model) {
    const int P = world_->size();
    std::vector<int> eps = {2};
    if (P != 2) eps.push_back(P);
    double dropped = 0;
    for (int ep : eps)
      for (const std::string backend : {"rowwise", "alltoall"}) {
        std::vector<std::string> o = base_overrides(dir_ + "/run", P);
        o.insert(o.end(), model.begin(), model.end());
        o.push_back("parallel.ep=" + std::to_string(ep));
        o.push_back("ep.backend=" + backend);
        std::vector<std::string> none = o;
        none.push_back("train.recompute=none");
        const RunResult want = run(*world_, none);
        dropped = std::max(dropped, want.dropped_fraction);
        for (const std::string mode : {"experts", "attention", "block"}) {
          std::vector<std::string> with = o;
          with.push_back("train.recompute=" + mode);
          const RunResult got = run(*world_, with);
          const std::string label = "ep " + std::to_string(ep) + " " + backend + ", recompute = " + mode + ", rank " +
                                    std::to_string(world_->rank());
          expect_bit_equal(want, got, label);
        }
      }
    return dropped;
  }

  static void expect_bit_equal(const RunResult& want, const RunResult& got, const std::string& label) {
    ASSERT_EQ(want.grads.size(), got.grads.size()) << label;
    for (size_t step = 0; step < want.grads.size(); ++step) {
      ASSERT_EQ(want.grads[step].size(), got.grads[step].size()) << label;
      ASSERT_FALSE(want.grads[step].empty()) << label;
      for (const auto& [name, g] : want.grads[step]) {
        ASSERT_TRUE(got.grads[step].count(name)) << label << ": no gradient of " << name;
        const std::vector<float>& h = got.grads[step].at(name);
        ASSERT_EQ(g.size(), h.size()) << label << ": " << name;
        // Same bits, held elements and the NaN of unheld ones alike.
        EXPECT_EQ(std::memcmp(g.data(), h.data(), g.size() * sizeof(float)), 0)
            << label << ": gradient of " << name << " in step " << step + 1;
      }
    }
    ASSERT_EQ(want.losses.size(), got.losses.size()) << label;
    for (size_t s = 0; s < want.losses.size(); ++s)
      EXPECT_EQ(want.losses[s], got.losses[s]) << label << ": loss of step " << s + 1;
  }

};

TEST_F(RecomputeUnderEp, LearnedRoutingWithDropsGradientsBitEqualNoRecompute) {
  const double dropped = expect_every_mode_matches({"model.capacity_factor=0.5"});
  EXPECT_GT(dropped, 0.05) << "the config should drop routes";
}

TEST_F(RecomputeUnderEp, SharedExpertAndDenseFirstLayerGradientsBitEqualNoRecompute) {
  expect_every_mode_matches({"model.num_hidden_layers=3", "model.first_k_dense_replace=1",
                             "model.dense_intermediate_size=24", "model.shared_expert_intermediate_size=16",
                             "model.num_key_value_heads=2", "model.qk_norm=\"per_head\""});
}

}  // namespace
}  // namespace moe

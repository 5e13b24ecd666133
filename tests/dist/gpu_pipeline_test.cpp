// ranks: 2 4
// Pipeline parallelism on GPUs (activations and their gradients through NCCL send/recv, in the
// message groups of parallel/pipeline_messages.h) computes what one GPU computes: for the same
// global batch and seed, every reduced gradient a rank holds after the first step within 1e-5
// relative L2 of the one-GPU run's (the bound the GPU train-step tests use for two runs of one
// step: cuDNN's attention backward is not bitwise deterministic), and 4 steps of losses within
// 1e-4, under 1F1B with pp = 2, the interleaved schedule with pp = 2 and 2 chunks per rank (more
// microbatches than stages, so its steady state exchanges in pairs), pp = 4, and pp = 2 x dp = 2.
//
// Where the job has more ranks than GPUs (the one-H200 machine: bench/gpu_pipeline_check.sh), the
// ranks share a GPU (shared_gpu.h).
// Skipped with the reason where no GPU or no NCCL is usable.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../gpu/gpu_test_util.h"
#include "../train/train_test_util.h"
#include "job_temp_dir_test.h"
#include "shared_gpu.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/core/device.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

constexpr double kGradRelTol = 1e-5;
constexpr double kLossRelTol = 1e-4;
constexpr int kSteps = 4;

// Head dim 16 (cuDNN needs a multiple of 8); 4 layers, the first dense, then MoE layers of 8
// experts top-2 with a shared expert; 4 microbatches of 2 sequences per step on one rank.
std::vector<std::string> gpu_overrides(const std::string& dir) {
  return {"run.device=\"cuda\"",
          "model.hidden_size=64",
          "model.intermediate_size=64",
          "model.num_hidden_layers=4",
          "model.first_k_dense_replace=1",
          "model.dense_intermediate_size=128",
          "model.shared_expert_intermediate_size=64",
          "model.dropless=true",
          "train.seq_len=64",
          "train.micro_batch_size=2",
          "train.global_batch_size=8",
          "train.lr=3e-3",
          "train.steps=" + std::to_string(kSteps),
          "run.dir=\"" + dir + "\""};
}

struct RunResult {
  std::map<std::string, std::vector<float>> grads;  // the first step's, parameters this rank holds
  std::vector<double> losses;
};

RunResult run(Communicator& world, const std::vector<std::string>& overrides) {
  const Config cfg = testing::small_config("", overrides);
  TrainOptions opts;
  opts.bench = true;
  opts.quiet = true;
  Trainer t(cfg, opts, world);
  EXPECT_EQ(t.device(), Device::CUDA);
  RunResult out;
  t.accumulate_gradients(0);
  t.store().reduced_gradients([&](const std::string& name, int64_t begin, int64_t end, const float* data) {
    std::vector<float>& g = out.grads[name];
    if (g.size() < static_cast<size_t>(end)) g.resize(static_cast<size_t>(end));
    std::copy(data, data + (end - begin), g.begin() + begin);
  });
  for (int64_t step = 0; step < cfg.train.steps; ++step) out.losses.push_back(t.train_step(step).loss);
  return out;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

class GpuPipeline : public testing::JobTempDirTest {
 protected:
  void SetUp() override {
    JobTempDirTest::SetUp();
    std::string why;
    if (!cuda_available(&why) || !nccl_available(&why)) GTEST_SKIP() << why;
    testing::share_gpu_if_needed(world_->rank(), world_->size());
  }

  const RunResult& reference() {
    if (!reference_) {
      LocalCommunicator local;
      reference_ = std::make_unique<RunResult>(run(local, gpu_overrides(dir_ + "/ref-" + std::to_string(world_->rank()))));
    }
    return *reference_;
  }

  void expect_matches(int ranks, const std::vector<std::string>& topology) {
    if (world_->size() < ranks) GTEST_SKIP() << "needs " << ranks << " ranks";
    const RunResult& ref = reference();
    MPI_Comm part = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, world_->rank() < ranks ? 0 : MPI_UNDEFINED, world_->rank(), &part);
    if (part == MPI_COMM_NULL) return;
    std::string label;
    for (const auto& s : topology) label += s + " ";
    {
      MpiCommunicator group(part);
      std::vector<std::string> o = gpu_overrides(dir_ + "/pp");
      o.insert(o.end(), topology.begin(), topology.end());
      const RunResult got = run(group, o);
      EXPECT_FALSE(got.grads.empty()) << label;
      double worst = 0;
      for (const auto& [name, g] : got.grads) {
        ASSERT_TRUE(ref.grads.count(name)) << name << " under " << label;
        const double err = rel_l2(g, ref.grads.at(name));
        worst = std::max(worst, err);
        EXPECT_LE(err, kGradRelTol) << "gradient of " << name << " under " << label;
      }
      ASSERT_EQ(got.losses.size(), ref.losses.size()) << label;
      for (size_t s = 0; s < got.losses.size(); ++s)
        EXPECT_NEAR(got.losses[s], ref.losses[s], kLossRelTol * ref.losses[s]) << "loss of step " << s + 1 << " under "
                                                                               << label;
      std::printf("  rank %d, %s: %zu gradients, worst relative L2 %.2e; losses %.6f .. %.6f (one GPU %.6f .. %.6f)\n",
                  world_->rank(), label.c_str(), got.grads.size(), worst, got.losses.front(), got.losses.back(),
                  ref.losses.front(), ref.losses.back());
    }
    MPI_Comm_free(&part);
  }

  std::unique_ptr<RunResult> reference_;
};

TEST_F(GpuPipeline, OneFOneBTwoStagesMatchesOneGpu) { expect_matches(2, {"parallel.pp=2"}); }
TEST_F(GpuPipeline, InterleavedTwoStagesTwoChunksMatchesOneGpu) {
  expect_matches(2, {"parallel.pp=2", "parallel.pp_schedule=\"interleaved\"", "parallel.pp_virtual=2"});
}
TEST_F(GpuPipeline, OneFOneBFourStagesMatchesOneGpu) { expect_matches(4, {"parallel.pp=4"}); }
TEST_F(GpuPipeline, TwoStagesTimesDataParallelTwoMatchesOneGpu) { expect_matches(4, {"parallel.pp=2"}); }

}  // namespace
}  // namespace moe

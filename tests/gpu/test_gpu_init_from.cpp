// `train --init-from` on the GPU: a checkpoint written by a CPU run, and its FP32 Hugging Face
// export, start GPU runs (DDP and FSDP) holding exactly its FP32 weights with zero moments, and
// the first step's loss is the CPU fine-tuning run's within BF16 tolerance (the GPU computes in
// BF16). Skipped with the reason where no GPU is usable.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "../train/init_from_checks.h"
#include "../train/train_test_util.h"
#include "gpu_test_util.h"
#include "moe/train/hf_interop.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

// Head dim 16 (cuDNN needs a multiple of 8), two MoE layers of 8 experts, top-2.
Config gpu_config(const std::string& dir, const std::string& device, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"run.device=\"" + device + "\"", "model.hidden_size=64", "model.intermediate_size=64",
                                "train.seq_len=64", "train.lr=3e-3"};
  o.insert(o.end(), extra.begin(), extra.end());
  return testing::small_config(dir, o);
}

TEST(GpuInitFrom, ACpuCheckpointAndItsExportStartGpuRunsWithItsExactWeights) {
  MOE_SKIP_WITHOUT_GPU();
  testing::TempDir src, hf_parent, fine_tune;  // the fine-tuning runs get their own run.dir
  TrainOptions quiet;
  quiet.quiet = true;
  Trainer(gpu_config(src.path, "cpu", {"train.steps=3"}), quiet, testing::local_world()).run();
  const std::string ckpt = src.path + "/step-000003", hf = hf_parent.path + "/hf";
  export_hf(ckpt, hf, int64_t{1} << 30, {}, DType::F32);
  TrainOptions init;
  init.quiet = init.bench = true;
  init.init_from = ckpt;
  const std::vector<std::string> ft = {"train.steps=1", "train.lr=1e-4"};
  const double cpu_loss =
      Trainer(gpu_config(fine_tune.path, "cpu", ft), init, testing::local_world()).run().steps.at(0).loss;
  const CheckpointReader reader(ckpt);
  for (const std::string& from : {ckpt, hf})
    for (const char* mode : {"ddp", "fsdp"}) {
      SCOPED_TRACE(from + " under " + mode);
      init.init_from = from;
      std::vector<std::string> o = ft;
      o.push_back(std::string("parallel.mode=\"") + mode + "\"");
      Trainer t(gpu_config(fine_tune.path, "cuda", o), init, testing::local_world());
      ASSERT_EQ(t.device(), Device::CUDA);
      testing::expect_weights_of(t, reader);
      const TrainSummary s = t.run();
      ASSERT_EQ(s.first_step, 0);
      EXPECT_NEAR(s.steps.at(0).loss, cpu_loss, 3e-2 * cpu_loss);
    }
}

// `moetrain eval` on the GPU (TrainOptions::evaluation_only): a store of the weights alone (the
// BF16 copy, or in FP8 the FP8 caches and the compact BF16 copy) reads a CPU checkpoint and
// evaluates it as a training store does (same kernels on the same weights: within 1e-5), with no
// gradients or optimizer state planned, and within BF16 tolerance of the CPU's loss.
TEST(GpuEvaluation, AStoreOfTheWeightsAloneEvaluatesACheckpointAsATrainingStoreDoes) {
  MOE_SKIP_WITHOUT_GPU();
  testing::TempDir src;
  TrainOptions quiet;
  quiet.quiet = true;
  const std::vector<std::string> shape = {"model.hidden_size=128", "model.intermediate_size=128"};
  std::vector<std::string> train = shape;
  train.push_back("train.steps=3");
  Trainer(gpu_config(src.path, "cpu", train), quiet, testing::local_world()).run();
  TrainOptions training;
  training.quiet = training.bench = true;
  training.checkpoint = std::make_shared<const CheckpointReader>(src.path + "/step-000003");
  TrainOptions evaluation = training;
  evaluation.evaluation_only = true;
  const double cpu_loss =
      Trainer(gpu_config(src.path + "-unused", "cpu", shape), evaluation, testing::local_world()).microbatch_loss(0);
  // Block recompute is what `moetrain eval` runs (its forward keeps only each layer's input).
  for (const char* extra : {"parallel.mode=\"ddp\"", "train.precision=\"fp8\"", "parallel.mode=\"fsdp\"",
                            "train.recompute=\"block\""}) {
    SCOPED_TRACE(extra);
    std::vector<std::string> o = shape;
    o.push_back(extra);
    const Config cfg = gpu_config(src.path + "-unused", "cuda", o);
    Trainer t(cfg, training, testing::local_world()), e(cfg, evaluation, testing::local_world());
    ASSERT_EQ(e.device(), Device::CUDA);
    EXPECT_EQ(e.memory_plan().gradients, 0u);
    EXPECT_EQ(e.memory_plan().optimizer, 0u);
    EXPECT_GT(t.memory_plan().gradients, 0u);
    const double a = t.microbatch_loss(0), b = e.microbatch_loss(0);
    EXPECT_NEAR(b, a, 1e-5 * a);
    EXPECT_NEAR(b, cpu_loss, 3e-2 * cpu_loss);
  }
}

}  // namespace
}  // namespace moe

// A model whose every layer is dense (first_k_dense_replace = num_hidden_layers) trains: the
// expert machinery steps aside, and asking for expert parallelism is refused with a message.
#include <gtest/gtest.h>

#include "moe/train/trainer.h"
#include "train_test_util.h"

namespace moe {
namespace {

// With the experts' width given, and 0 (which the key table accepts when every layer is dense).
TEST(DenseModel, AllDenseLayersTrainAndLossFalls) {
  for (const char* expert_width : {"model.intermediate_size=32", "model.intermediate_size=0"}) {
    SCOPED_TRACE(expert_width);
    testing::TempDir dir;
    TrainOptions quiet;
    quiet.quiet = true;
    quiet.bench = true;
    Trainer t(testing::small_config(dir.path, {"model.first_k_dense_replace=2", "model.dense_intermediate_size=64",
                                               expert_width, "train.steps=8", "train.warmup_steps=1"}),
              quiet, testing::local_world());
    const TrainSummary s = t.run();
    ASSERT_EQ(s.steps.size(), 8u);
    EXPECT_LT(s.steps.back().lm_loss, s.steps.front().lm_loss);
    EXPECT_EQ(s.steps.back().lb_loss, 0.0);  // no router, no auxiliary losses
  }
}

TEST(DenseModel, ExpertParallelismWithoutMoeLayersIsRefused) {
  testing::TempDir dir;
  TrainOptions quiet;
  quiet.quiet = true;
  try {
    Trainer t(testing::small_config(dir.path, {"model.first_k_dense_replace=2", "model.dense_intermediate_size=64",
                                               "parallel.ep=2"}),
              quiet, testing::local_world());
    FAIL() << "ep = 2 accepted for a model without MoE layers";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.ep"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moe

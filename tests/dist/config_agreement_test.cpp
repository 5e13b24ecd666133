// ranks: 2
// Ranks given different configs (another --steps, another hidden_size, other pipeline chunk sizes)
// must not crash in a collective or wait forever: the first collective of the Trainer compares the
// configs and every rank ends with the same error naming the first differing key and both values.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "moe/comm/mpi_communicator.h"
#include "moe/core/error.h"
#include "moe/train/config_agreement.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

Config tiny(const std::vector<std::string>& extra) {
  std::vector<std::string> o = {"run.device=\"cpu\"", "model.hidden_size=32", "model.intermediate_size=16",
                                "train.seq_len=16", "train.global_batch_size=4", "train.micro_batch_size=2",
                                "data.synthetic_tokens=20000", "data.synthetic_eval_tokens=2000"};
  o.insert(o.end(), extra.begin(), extra.end());
  return load_config("tiny", o);
}

std::string trainer_error(const Config& cfg, Communicator& world) {
  TrainOptions opts;
  opts.quiet = true;
  opts.bench = true;
  try {
    Trainer t(cfg, opts, world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigAgreement, SameConfigPasses) {
  MpiCommunicator world(MPI_COMM_WORLD);
  EXPECT_NO_THROW(check_config_agrees(tiny({}), world));
}

TEST(ConfigAgreement, DifferentStepsOnOneRankEndEveryRankWithTheKeyNamed) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const std::string steps = world.rank() == 1 ? "train.steps=5" : "train.steps=10";
  const std::string e = trainer_error(tiny({steps}), world);
  EXPECT_NE(e.find("different configs: train.steps = 10 on rank 0 but 5 on rank 1"), std::string::npos) << e;
}

TEST(ConfigAgreement, DifferentModelShapeIsNamedBeforeAnyBufferIsPlanned) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const std::string hidden = world.rank() == 0 ? "model.hidden_size=64" : "model.hidden_size=32";
  const std::string e = trainer_error(tiny({hidden, "parallel.ep=2"}), world);
  EXPECT_NE(e.find("model.hidden_size = 64 on rank 0 but 32 on rank 1"), std::string::npos) << e;
}

TEST(ConfigAgreement, DifferentPipelineChunkSizesAreNamedWithBothArrays) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const std::string layers = world.rank() == 0 ? "parallel.pp_layers=[3,1]" : "parallel.pp_layers=[2,2]";
  const std::string e = trainer_error(tiny({"model.num_hidden_layers=4", "parallel.pp=2", layers}), world);
  EXPECT_NE(e.find("parallel.pp_layers = [3, 1] on rank 0 but [2, 2] on rank 1"), std::string::npos) << e;
}

}  // namespace
}  // namespace moe

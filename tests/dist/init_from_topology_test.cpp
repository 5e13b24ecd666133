// ranks: 2
// `--init-from` under any topology: weights saved under ep = 2 start a single-process run, and a
// single-process checkpoint (or its Hugging Face export, read in ranges that start and end inside
// experts under FSDP) starts runs under ep = 2, pure data parallelism and FSDP. Every rank holds
// the source's weights bit for bit with zero moments, and the first step's loss matches the
// single-process fine-tuning run within FP32 tolerance (another summation order).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "../train/init_from_checks.h"
#include "moe/comm/local_communicator.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/train/hf_interop.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

constexpr double kLossTol = 1e-5;  // relative, for another topology (another summation order)

Config config(const std::string& run_dir, std::vector<std::string> extra) {
  std::vector<std::string> o = {"model.hidden_size=32",        "model.intermediate_size=16",
                                "model.num_experts=8",         "model.dropless=true",
                                "train.seq_len=16",            "train.global_batch_size=8",
                                "train.micro_batch_size=2",    "train.warmup_steps=1",
                                "train.eval_every=0",          "train.eval_batches=0",
                                "data.synthetic_tokens=20000", "data.synthetic_eval_tokens=2000",
                                "run.device=\"cpu\"",          "run.dir=\"" + run_dir + "\""};
  o.insert(o.end(), extra.begin(), extra.end());
  return load_config("tiny", o);
}

// A 3-step run that saves its last step; returns the checkpoint.
std::string save_source(Communicator& world, const std::string& run_dir, const std::string& ep) {
  TrainOptions opts;
  opts.quiet = true;
  Trainer t(config(run_dir, {"train.steps=3", "parallel.ep=" + ep}), opts, world);
  t.run();
  return run_dir + "/step-000003";
}

// A fine-tuning trainer (other LR and steps than the source) that writes nothing.
std::unique_ptr<Trainer> fine_tune(Communicator& world, const std::string& from, std::vector<std::string> parallel) {
  TrainOptions opts;
  opts.quiet = opts.bench = true;
  opts.init_from = from;
  parallel.insert(parallel.end(), {"train.steps=1", "train.lr=1e-4"});
  return std::make_unique<Trainer>(config("/nonexistent-run-dir", parallel), opts, world);
}

TEST(InitFromTopology, WeightsSavedUnderOneTopologyStartARunUnderAnother) {
  MpiCommunicator world(MPI_COMM_WORLD);
  char dir[256] = {0};
  if (world.rank() == 0) {
    char tmpl[] = "/tmp/moetrain-init-topo-XXXXXX";
    std::strncpy(dir, mkdtemp(tmpl), sizeof(dir) - 1);
  }
  MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
  const std::string root = dir;

  const std::string from_ep2 = save_source(world, root + "/ep2", "2");
  // Rank 0 alone: the ep = 2 checkpoint into one process; then a single-process source, its
  // FP32 export, and the reference loss of fine-tuning from it in one process.
  double reference_loss = 0;
  std::string from_one = root + "/one/step-000003", hf = root + "/hf";
  if (world.rank() == 0) {
    LocalCommunicator one;
    {
      const auto t = fine_tune(one, from_ep2, {});
      SCOPED_TRACE("ep=2 checkpoint into one process");
      testing::expect_weights_of(*t, CheckpointReader(from_ep2));
    }
    save_source(one, root + "/one", "1");
    export_hf(from_one, hf, int64_t{1} << 30, {}, DType::F32);
    reference_loss = fine_tune(one, from_one, {})->run().steps.at(0).loss;
  }
  MPI_Bcast(&reference_loss, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);

  const CheckpointReader one_ckpt(from_one);
  struct Case {
    const char* label;
    std::string from;
    std::vector<std::string> parallel;
  };
  const std::vector<Case> cases = {{"ep=2", from_one, {"parallel.ep=2"}},
                                   {"data parallel", from_one, {"parallel.ep=1"}},
                                   {"fsdp", from_one, {"parallel.mode=\"fsdp\""}},
                                   {"fsdp from the Hugging Face export", hf, {"parallel.mode=\"fsdp\""}},
                                   {"ep=2 from the Hugging Face export", hf, {"parallel.ep=2"}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.label) + " on 2 ranks, rank " + std::to_string(world.rank()));
    const auto t = fine_tune(world, c.from, c.parallel);
    testing::expect_weights_of(*t, one_ckpt);
    const TrainSummary s = t->run();
    ASSERT_EQ(s.first_step, 0);
    ASSERT_EQ(s.steps.size(), 1u);
    EXPECT_NEAR(s.steps[0].loss, reference_loss, kLossTol * reference_loss);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world.rank() == 0) std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace moe

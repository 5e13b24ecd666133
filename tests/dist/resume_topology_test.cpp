// ranks: 4
// Checkpoints are topology independent: a run saved at step 3 under DDP+EP (ep = 4) resumes
// under ep = 4 (bit-equal to the uninterrupted run), ep = 2 with 2 expert replicas, pure data
// parallelism, FSDP on 4 ranks and a single process, and the next 3 losses match the
// uninterrupted run within FP32 tolerance.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "moe/comm/local_communicator.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

constexpr double kLossTol = 1e-5;  // relative, for another topology (another summation order)

std::vector<std::string> overrides(const std::string& run_dir, std::vector<std::string> extra) {
  std::vector<std::string> o = {"model.hidden_size=32",         "model.intermediate_size=16",
                                "model.num_experts=8",          "model.dropless=true",
                                "train.seq_len=16",             "train.global_batch_size=8",
                                "train.micro_batch_size=2",     "train.warmup_steps=1",
                                "train.steps=6",                "train.eval_every=0",
                                "train.eval_batches=0",         "run.save_final=false",
                                "data.synthetic_tokens=20000",  "data.synthetic_eval_tokens=2000",
                                "run.dir=\"" + run_dir + "\""};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

std::vector<double> losses(Communicator& world, const std::vector<std::string>& o, const std::string& resume,
                           bool write) {
  TrainOptions opts;
  opts.quiet = true;
  opts.bench = !write;
  opts.resume = resume;
  std::vector<std::string> cpu = {"run.device=\"cpu\""};  // the CPU path, also where a GPU exists
  cpu.insert(cpu.end(), o.begin(), o.end());
  Trainer t(load_config("tiny", cpu), opts, world);
  std::vector<double> out;
  for (const StepRecord& r : t.run().steps) out.push_back(r.loss);
  return out;
}

TEST(ResumeTopology, CheckpointSavedUnderEp4ResumesUnderEveryTopology) {
  MpiCommunicator world(MPI_COMM_WORLD);
  char dir[256] = {0};
  if (world.rank() == 0) {
    char tmpl[] = "/tmp/moetrain-topo-XXXXXX";
    std::strncpy(dir, mkdtemp(tmpl), sizeof(dir) - 1);
  }
  MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
  const std::string root = dir;

  const std::vector<double> full = losses(world, overrides(root + "/full", {"parallel.ep=4"}), "", false);
  ASSERT_EQ(full.size(), 6u);
  const std::string run = root + "/saved";
  // The same 6-step run (same LR schedule), checkpointing at step 3; resuming from that checkpoint
  // is what a run stopped at step 3 would do.
  losses(world, overrides(run, {"parallel.ep=4", "train.save_every=3"}), "", true);
  const std::string ckpt = run + "/step-000003";
  ASSERT_TRUE(std::filesystem::exists(ckpt + "/index.json"));

  auto expect_tail = [&](const std::vector<double>& tail, bool bit_equal, const std::string& label) {
    ASSERT_EQ(tail.size(), 3u) << label;
    for (size_t i = 0; i < 3; ++i) {
      if (bit_equal)
        EXPECT_EQ(tail[i], full[3 + i]) << label << ", step " << 4 + i;
      else
        EXPECT_NEAR(tail[i], full[3 + i], kLossTol * full[3 + i]) << label << ", step " << 4 + i;
    }
  };
  expect_tail(losses(world, overrides(run, {"parallel.ep=4"}), ckpt, false), true, "ep=4 (same topology)");
  expect_tail(losses(world, overrides(run, {"parallel.ep=2"}), ckpt, false), false, "ep=2 x 2 replicas");
  expect_tail(losses(world, overrides(run, {"parallel.ep=1"}), ckpt, false), false, "data parallel only");
  expect_tail(losses(world, overrides(run, {"parallel.mode=fsdp"}), ckpt, false), false, "fsdp on 4 ranks");
  if (world.rank() == 0) {
    LocalCommunicator one;
    expect_tail(losses(one, overrides(run, {}), ckpt, false), false, "one process");
    std::filesystem::remove_all(root);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace moe

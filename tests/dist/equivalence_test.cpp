// ranks: 2 4
// Every topology computes what the single-rank run computes: for the same global batch and
// seed (learned routing, no drops), the reduced gradients of 3 optimizer steps, gathered to
// logical tensors, and their losses match the single-process run within FP32 tolerance. Topologies: DDP with ep in {1, 2, world} (rowwise and alltoall dispatch), FSDP,
// and gradient accumulation over 2 microbatches per rank (against the single-process run with
// the same microbatch size: the auxiliary losses are per-microbatch quantities).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "moe/comm/local_communicator.h"
#include "job_temp_dir_test.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

// Stated tolerances: relative to the largest magnitude of the reference tensor / loss. Step 1
// differs only by summation order; later steps also carry the FP32 drift of the parameters
// through AdamW, which amplifies tiny differences where gradients are near zero.
constexpr double kGradTol = 2e-5;
constexpr double kLaterStepGradTol = 1e-4;
constexpr double kLossTol = 1e-5;

std::vector<std::string> base_overrides(const std::string& run_dir) {
  return {"model.hidden_size=32",       "model.intermediate_size=16",   "model.num_experts=8",
          "model.num_experts_per_tok=2", "model.dropless=true",         "train.seq_len=16",
          "train.global_batch_size=8",  "train.warmup_steps=1",         "train.steps=3",
          "train.eval_every=0",         "train.eval_batches=0",         "run.save_final=false",
          "data.synthetic_tokens=20000", "data.synthetic_eval_tokens=2000", "run.dir=\"" + run_dir + "\""};
}

struct RunResult {
  // Reduced gradients of each of the 3 steps, as logical tensors (pieces placed at their ranges).
  std::vector<std::map<std::string, std::vector<float>>> grads;
  std::vector<double> losses;
  std::optional<double> eval_loss;  // the held-out loss after the steps, train.eval_batches = 4
};

RunResult run(Communicator& world, std::vector<std::string> overrides, bool full_tensors) {
  TrainOptions quiet;
  quiet.quiet = true;
  quiet.bench = true;  // nothing written
  overrides.insert(overrides.begin(), "run.device=\"cpu\"");  // the CPU path, also where a GPU exists
  const Config cfg = load_config("tiny", overrides);
  RunResult out;
  Trainer t(cfg, quiet, world);
  for (int64_t step = 0; step < cfg.train.steps; ++step) {
    // The reduced gradient of this step (reduced_gradients changes the buffers, so the step
    // itself accumulates again from zero).
    t.accumulate_gradients(step);
    std::map<std::string, std::vector<float>>& grads = out.grads.emplace_back();
    t.store().reduced_gradients([&](const std::string& name, int64_t begin, int64_t end, const float* data) {
      std::vector<float>& g = grads[name];
      if (full_tensors) {
        const ParamEntry& e = t.registry().entry(t.registry().index(name));
        g.resize(static_cast<size_t>(e.global_shape.numel()), std::nanf(""));
      } else if (g.size() < static_cast<size_t>(end)) {
        g.resize(static_cast<size_t>(end), std::nanf(""));
      }
      std::copy(data, data + (end - begin), g.begin() + begin);
    });
    out.losses.push_back(t.train_step(step).loss);
  }
  out.eval_loss = t.evaluate(4);
  return out;
}

class Equivalence : public testing::JobTempDirTest {
 protected:
  // The single-process run with the same microbatch size (the load-balancing and z losses are
  // defined per microbatch, so the microbatch size is part of the math; the topology is not).
  const RunResult& reference(const std::string& micro) {
    auto it = references_.find(micro);
    if (it != references_.end()) return it->second;
    LocalCommunicator local;
    std::vector<std::string> o = base_overrides(dir_ + "/ref");
    o.push_back(micro);
    return references_[micro] = run(local, o, true);
  }

  void expect_matches(const std::vector<std::string>& topology) {
    const RunResult& reference_ = reference(topology.back());  // the micro_batch_size override comes last
    std::vector<std::string> o = base_overrides(dir_ + "/dist");
    o.insert(o.end(), topology.begin(), topology.end());
    const RunResult got = run(*world_, o, false);
    std::string label;
    for (const auto& s : topology) label += s + " ";
    ASSERT_EQ(got.grads.size(), reference_.grads.size());
    for (size_t step = 0; step < got.grads.size(); ++step)
    for (const auto& [name, g] : got.grads[step]) {
      const std::vector<float>& ref = reference_.grads[step].at(name);
      double scale = 0, diff = 0;
      for (float v : ref) scale = std::max(scale, std::fabs(static_cast<double>(v)));
      size_t compared = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        if (std::isnan(g[i])) continue;  // not held by this rank
        diff = std::max(diff, std::fabs(static_cast<double>(g[i]) - ref[i]));
        ++compared;
      }
      EXPECT_GT(compared, 0u) << name;
      const double tol = step == 0 ? kGradTol : kLaterStepGradTol;
      EXPECT_LE(diff, tol * std::max(scale, 1e-12))
          << "gradient of " << name << " in step " << step + 1 << " under " << label;
    }
    ASSERT_EQ(got.losses.size(), reference_.losses.size());
    for (size_t s = 0; s < got.losses.size(); ++s)
      EXPECT_NEAR(got.losses[s], reference_.losses[s], kLossTol * reference_.losses[s])
          << "loss of step " << s + 1 << " under " << label;
    // train.eval_batches counts microbatches over all data ranks: the same held-out windows, and
    // the same loss, on any topology whose data ranks divide it (each rank used to take that many).
    ASSERT_TRUE(got.eval_loss.has_value() && reference_.eval_loss.has_value()) << label;
    EXPECT_NEAR(*got.eval_loss, *reference_.eval_loss, kLossTol * *reference_.eval_loss)
        << "held-out loss under " << label;
    // Every logical element of every parameter is held by some rank.
    for (const auto& [name, ref] : reference_.grads[0]) {
      std::vector<float> mine(ref.size(), 0.0f);
      auto it = got.grads[0].find(name);
      if (it != got.grads[0].end())
        for (size_t i = 0; i < it->second.size(); ++i) mine[i] = std::isnan(it->second[i]) ? 0.0f : 1.0f;
      MPI_Allreduce(MPI_IN_PLACE, mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
      for (float m : mine) ASSERT_EQ(m, 1.0f) << name << " has elements no rank holds under " << label;
    }
  }

  std::map<std::string, RunResult> references_;
};

std::string world_ep() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return "parallel.ep=" + std::to_string(size);
}

TEST_F(Equivalence, DataParallelOnly) { expect_matches({"parallel.ep=1", "train.micro_batch_size=2"}); }
TEST_F(Equivalence, ExpertParallelOverTheWorldRowwise) { expect_matches({world_ep(), "train.micro_batch_size=2"}); }
TEST_F(Equivalence, ExpertParallelOverTheWorldAlltoall) {
  expect_matches({world_ep(), "ep.backend=alltoall", "train.micro_batch_size=2"});
}
TEST_F(Equivalence, ExpertParallelTwoWithReplicas) { expect_matches({"parallel.ep=2", "train.micro_batch_size=2"}); }
TEST_F(Equivalence, TwoAccumulationMicrobatches) { expect_matches({world_ep(), "train.micro_batch_size=1"}); }
TEST_F(Equivalence, Fsdp) { expect_matches({"parallel.mode=fsdp", "train.micro_batch_size=2"}); }

}  // namespace
}  // namespace moe

// ranks: 4
// Pipeline parallelism computes what the single-process run computes: for the same global batch
// and seed (learned routing, no drops, 4 layers), the reduced gradients of 3 optimizer steps and
// their losses match the single-process run within the FP32 tolerance of equivalence_test, under
// 1F1B with pp = 2 (2 ranks), pp = 4, pp = 2 x ep = 2, pp = 2 x dp = 2 (with gradient buckets
// reduced during the last microbatch's backward passes), given stage sizes (each
// stage then holds exactly the layers the sizes give it), and the interleaved schedule with pp = 2
// and 2 chunks per rank, and in FP8. A checkpoint saved under
// pp = 2 x ep = 2 resumes under pp = 4, pp = 1 x ep = 2 and one process with the uninterrupted
// run's losses, in BF16 and FP8.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "moe/comm/local_communicator.h"
#include "job_temp_dir_test.h"
#include "../train/trainer_test_util.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/parallel/ddp_store.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

constexpr double kGradTol = 2e-5;           // equivalence_test's, relative to the tensor's largest magnitude
constexpr double kLaterStepGradTol = 1e-4;  // steps 2 and 3 carry the FP32 drift of the weights
constexpr double kLossTol = 1e-5;

std::vector<std::string> base_overrides(const std::string& run_dir) {
  return {"run.device=\"cpu\"",          "model.hidden_size=32",          "model.intermediate_size=16",
          "model.num_experts=8",         "model.num_experts_per_tok=2",   "model.num_hidden_layers=4",
          "model.dropless=true",         "train.seq_len=16",              "train.global_batch_size=8",
          "train.micro_batch_size=2",    "train.warmup_steps=1",          "train.steps=3",
          "train.eval_every=0",          "train.eval_batches=0",          "run.save_final=false",
          "data.synthetic_tokens=20000", "data.synthetic_eval_tokens=2000", "run.dir=\"" + run_dir + "\""};
}

struct RunResult {
  std::vector<std::map<std::string, std::vector<float>>> grads;  // per step; NaN = not held here
  std::vector<double> losses;
  int64_t buckets_started_in_backward = 0;  // the overlapped reduction (parallel.overlap_grad_reduce, on)
};

RunResult run(Communicator& world, std::vector<std::string> overrides) {
  const Config cfg = load_config("tiny", overrides);
  RunResult out;
  Trainer t(cfg, testing::quiet_bench(), world);
  for (int64_t step = 0; step < cfg.train.steps; ++step) {
    out.grads.push_back(testing::step_gradients(t, step, std::nanf("")));
    out.losses.push_back(t.train_step(step).loss);
  }
  if (const auto* ddp = dynamic_cast<const DdpStore*>(&t.store()))
    out.buckets_started_in_backward = ddp->buckets_started_in_backward();
  return out;
}

class Pipeline : public testing::JobTempDirTest {
 protected:
  // The single-process run with `both` (the settings the compared runs share, e.g. the precision).
  const RunResult& reference(const std::vector<std::string>& both) {
    std::string key;
    for (const auto& s : both) key += s + " ";
    auto it = references_.find(key);
    if (it == references_.end()) {
      LocalCommunicator local;
      std::vector<std::string> o = base_overrides(dir_ + "/ref" + std::to_string(references_.size()));
      o.insert(o.end(), both.begin(), both.end());
      it = references_.emplace(key, run(local, o)).first;
    }
    return it->second;
  }

  // Runs `topology` on the first `ranks` ranks of the job (the others wait) and compares with the
  // single-process run: every gradient element a rank holds, every loss, and every element held by
  // some rank. layers_of_stage, when given, lists the layers each pipeline stage must hold (those
  // whose gradients its ranks report). `both`: settings of both runs (the reference is run with them).
  void expect_matches(int ranks, const std::vector<std::string>& topology,
                      const std::vector<std::set<int64_t>>& layers_of_stage = {}, bool overlaps = false,
                      const std::vector<std::string>& both = {}) {
    const RunResult& ref = reference(both);
    const int me = world_->rank();
    MPI_Comm part = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, me < ranks ? 0 : MPI_UNDEFINED, me, &part);
    if (part == MPI_COMM_NULL) return;
    std::string label;
    for (const auto& s : topology) label += s + " ";
    {
      MpiCommunicator group(part);
      std::vector<std::string> o = base_overrides(dir_ + "/dist");
      o.insert(o.end(), both.begin(), both.end());
      o.insert(o.end(), topology.begin(), topology.end());
      const RunResult got = run(group, o);
      // With data-parallel ranks in a stage, some gradient buckets are reduced during the last
      // microbatch's backward passes, not after the pipeline phase.
      if (overlaps) {
        EXPECT_GT(got.buckets_started_in_backward, 0) << "no bucket overlapped the backward under " << label;
      }
      if (!layers_of_stage.empty()) {
        const std::string prefix = "model.layers.";
        std::set<int64_t> held;
        for (const auto& [name, g] : got.grads[0])
          if (name.rfind(prefix, 0) == 0) held.insert(std::stoll(name.substr(prefix.size())));
        const int stage = me / (ranks / static_cast<int>(layers_of_stage.size()));
        EXPECT_EQ(held, layers_of_stage[stage]) << "layers held by pipeline stage " << stage << " under " << label;
      }
      ASSERT_EQ(got.grads.size(), ref.grads.size());
      for (size_t step = 0; step < got.grads.size(); ++step)
        for (const auto& [name, g] : got.grads[step]) {
          const std::vector<float>& want = ref.grads[step].at(name);
          double scale = 0, diff = 0;
          for (float v : want) scale = std::max(scale, std::fabs(static_cast<double>(v)));
          for (size_t i = 0; i < g.size(); ++i)
            if (!std::isnan(g[i])) diff = std::max(diff, std::fabs(static_cast<double>(g[i]) - want[i]));
          const double tol = step == 0 ? kGradTol : kLaterStepGradTol;
          EXPECT_LE(diff, tol * std::max(scale, 1e-12)) << "gradient of " << name << " in step " << step + 1
                                                        << " under " << label;
        }
      ASSERT_EQ(got.losses.size(), ref.losses.size());
      for (size_t s = 0; s < got.losses.size(); ++s)
        EXPECT_NEAR(got.losses[s], ref.losses[s], kLossTol * ref.losses[s]) << "loss of step " << s + 1 << " under "
                                                                            << label;
      for (const auto& [name, want] : ref.grads[0]) {
        std::vector<float> held(want.size(), 0.0f);
        auto it = got.grads[0].find(name);
        if (it != got.grads[0].end())
          for (size_t i = 0; i < it->second.size(); ++i) held[i] = std::isnan(it->second[i]) ? 0.0f : 1.0f;
        MPI_Allreduce(MPI_IN_PLACE, held.data(), static_cast<int>(held.size()), MPI_FLOAT, MPI_MAX, part);
        for (float h : held) ASSERT_EQ(h, 1.0f) << name << " has elements no rank holds under " << label;
      }
    }
    MPI_Comm_free(&part);
  }

  std::map<std::string, RunResult> references_;
};

TEST_F(Pipeline, OneFOneBTwoStagesMatchesOneProcess) { expect_matches(2, {"parallel.pp=2"}); }
TEST_F(Pipeline, OneFOneBFourStagesMatchesOneProcess) { expect_matches(4, {"parallel.pp=4"}); }
TEST_F(Pipeline, TwoStagesTimesExpertParallelTwoMatchesOneProcess) {
  expect_matches(4, {"parallel.pp=2", "parallel.ep=2"});
}
TEST_F(Pipeline, TwoStagesTimesDataParallelTwoMatchesOneProcess) {
  expect_matches(4, {"parallel.pp=2", "parallel.ep=1", "parallel.grad_bucket_bytes=4096"}, {}, /*overlaps=*/true);
}
TEST_F(Pipeline, GivenStageSizesMatchOneProcess) {
  // Not the balanced split ([3, 1]: the LM head weighs on the last stage), so the layout is the given one.
  expect_matches(2, {"parallel.pp=2", "parallel.pp_layers=[1,3]", "ep.backend=alltoall"}, {{0}, {1, 2, 3}});
}
TEST_F(Pipeline, InterleavedTwoStagesTwoChunksMatchesOneProcess) {
  expect_matches(2, {"parallel.pp=2", "parallel.pp_schedule=\"interleaved\"", "parallel.pp_virtual=2"});
}
// Recomputed activations of several microbatches in flight share one buffer; under experts and
// attention a backward that follows its own forward reads the forward's (model/recompute.h), which
// the interleaved schedule makes happen on some passes and not on others.
TEST_F(Pipeline, RecomputedBlocksInFlightMatchOneProcess) {
  expect_matches(2, {"parallel.pp=2", "train.recompute=\"block\""});
  expect_matches(2, {"parallel.pp=2", "train.recompute=\"experts\""});
  expect_matches(2, {"parallel.pp=2", "parallel.pp_schedule=\"interleaved\"", "parallel.pp_virtual=2",
                     "train.recompute=\"attention\""});
}

// FP8 (emulated on CPU ranks): each stage keeps the FP8 caches of its own layers only, refreshed
// by its optimizer (in the update with one rank per stage, after the ZeRO-1 gather with two); the
// stages compute what one process computes in FP8 (the same quantized operands: the caches come
// from the same weights, the activations from the same values), within the FP32 tolerances above.
// Under pp = 2 and 4, pp = 2 x dp = 2 with the overlapped reduction, pp = 2 x ep = 2 with payload
// fp8, two chunks per rank (a stage's layers are not contiguous), recomputed blocks, and a model
// with a dense first layer and shared experts (their MLP caches on the stages).
TEST_F(Pipeline, Fp8StagesMatchOneProcessInFp8) {
  const std::vector<std::string> fp8 = {"train.precision=\"fp8\""};
  EXPECT_NE(reference(fp8).losses, reference({}).losses) << "the FP8 reference computed the BF16 run's losses";
  expect_matches(2, {"parallel.pp=2"}, {}, false, fp8);
  expect_matches(4, {"parallel.pp=4"}, {}, false, fp8);
  expect_matches(4, {"parallel.pp=2", "parallel.ep=1", "parallel.grad_bucket_bytes=4096"}, {}, /*overlaps=*/true, fp8);
  expect_matches(4, {"parallel.pp=2", "parallel.ep=2", "ep.payload=\"fp8\""}, {}, false, fp8);
  expect_matches(2, {"parallel.pp=2", "parallel.pp_schedule=\"interleaved\"", "parallel.pp_virtual=2"}, {}, false,
                 fp8);
  expect_matches(2, {"parallel.pp=2", "train.recompute=\"block\""}, {}, false, fp8);
  std::vector<std::string> mixed = fp8;
  mixed.insert(mixed.end(), {"model.first_k_dense_replace=1", "model.dense_intermediate_size=32",
                             "model.shared_expert_intermediate_size=16"});
  expect_matches(2, {"parallel.pp=2", "parallel.pp_layers=[2,2]"}, {{0, 1}, {2, 3}}, false, mixed);
}

std::vector<double> losses(Communicator& world, std::vector<std::string> o, const std::string& resume, bool write) {
  TrainOptions opts;
  opts.quiet = true;
  opts.bench = !write;
  opts.resume = resume;
  Trainer t(load_config("tiny", o), opts, world);
  std::vector<double> out;
  for (const StepRecord& r : t.run().steps) out.push_back(r.loss);
  return out;
}

// Evaluation runs forward passes through the stages (the last one holds the loss): the held-out
// loss at the end of a run equals the single-process run's under 1F1B, interleaved and pp = 4.
TEST_F(Pipeline, HeldOutLossThroughTheStagesMatchesOneProcess) {
  auto eval_loss = [&](Communicator& world, const std::string& dir, std::vector<std::string> extra) {
    std::vector<std::string> o = base_overrides(dir);
    o.insert(o.end(), {"train.eval_batches=2", "train.eval_every=2", "train.steps=2"});
    o.insert(o.end(), extra.begin(), extra.end());
    TrainOptions opts;  // not a bench: a bench run skips evaluations
    opts.quiet = true;
    const TrainSummary s = Trainer(load_config("tiny", o), opts, world).run();
    EXPECT_TRUE(s.eval_loss.has_value());
    return s.eval_loss.value_or(0.0);
  };
  LocalCommunicator one;
  const double want = eval_loss(one, dir_ + "/eval-one-" + std::to_string(world_->rank()), {});
  EXPECT_GT(want, 0);
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.pp=2"}, {"parallel.pp=2", "parallel.pp_schedule=\"interleaved\"", "parallel.pp_virtual=2"},
      {"parallel.pp=4"}};
  for (size_t n = 0; n < layouts.size(); ++n) {
    const std::vector<std::string>& layout = layouts[n];
    const int ranks = layout[0] == "parallel.pp=4" ? 4 : 2;
    MPI_Comm part = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, world_->rank() < ranks ? 0 : MPI_UNDEFINED, world_->rank(), &part);
    if (part == MPI_COMM_NULL) continue;
    {
      MpiCommunicator group(part);
      EXPECT_NEAR(eval_loss(group, dir_ + "/eval-pp-" + std::to_string(n), layout), want, kLossTol * want)
          << layout.back();
    }
    MPI_Comm_free(&part);
  }
}

// The float32 values of a .npy file written by write_npy_f32 (format 1.0: the header's length in
// bytes 8-9).
std::vector<float> npy_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_GT(bytes.size(), 10u) << path;
  if (bytes.size() <= 10) return {};
  const size_t data = 10 + (static_cast<unsigned char>(bytes[8]) | static_cast<unsigned char>(bytes[9]) << 8);
  std::vector<float> values((bytes.size() - data) / sizeof(float));
  std::memcpy(values.data(), bytes.data() + data, values.size() * sizeof(float));
  return values;
}

// `eval --logits` under pipeline stages: the last stage's rank that evaluated data rank 0's rows
// sends the first microbatch's logits to rank 0, which writes them; they equal the one-process
// run's under 1F1B, interleaved, pp = 4 and pp = 2 x ep = 2. Before, pp > 1 was refused.
TEST_F(Pipeline, FirstMicrobatchLogitsThroughTheStagesMatchOneProcess) {
  auto logits = [&](Communicator& world, const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> o = base_overrides(dir_ + "/" + name);
    o.insert(o.end(), extra.begin(), extra.end());
    const std::string npy = dir_ + "/" + name + "-logits.npy";
    Trainer(load_config("tiny", o), testing::quiet_bench(), world).evaluate_data("synthetic", 0, npy);
    return world.rank() == 0 ? npy_floats(npy) : std::vector<float>{};
  };
  std::vector<float> want;
  if (world_->rank() == 0) {
    LocalCommunicator one;
    want = logits(one, "logits-one", {});
    ASSERT_EQ(want.size(), 2u * 16 * 512);  // micro_batch_size x seq_len x the tiny vocabulary
  }
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.pp=2"},
      {"parallel.pp=2", "parallel.pp_schedule=\"interleaved\"", "parallel.pp_virtual=2"},
      {"parallel.pp=4"},
      {"parallel.pp=2", "parallel.ep=2"}};
  for (size_t n = 0; n < layouts.size(); ++n) {
    const int ranks = layouts[n].size() == 1 && layouts[n][0] == "parallel.pp=2" ? 2
                      : layouts[n].size() == 3                                   ? 2
                                                                                 : 4;
    MPI_Comm part = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, world_->rank() < ranks ? 0 : MPI_UNDEFINED, world_->rank(), &part);
    if (part == MPI_COMM_NULL) continue;
    {
      MpiCommunicator group(part);
      const std::vector<float> got = logits(group, "logits-" + std::to_string(n), layouts[n]);
      if (group.rank() == 0) {
        ASSERT_EQ(got.size(), want.size()) << layouts[n].back();
        double worst = 0, scale = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
          scale = std::max(scale, std::abs(static_cast<double>(want[i])));
        }
        EXPECT_LE(worst, kLossTol * scale) << layouts[n].back() << ": largest difference " << worst;
      }
    }
    MPI_Comm_free(&part);
  }
}

// Saves under pp = 2 x ep = 2 after step 3 and resumes under pp = 4, pp = 1 x ep = 2 and one
// process: each resumed run's last 3 losses are the uninterrupted run's. `both`: settings of every
// run (FP8: the caches are not saved, each topology derives its stages' caches from the loaded
// weights).
void expect_resumes_under_other_topologies(Communicator& world, const std::string& dir,
                                           const std::vector<std::string>& both) {
  auto with = [&](const std::string& run_dir, std::vector<std::string> extra) {
    std::vector<std::string> o = base_overrides(run_dir);
    o.push_back("train.steps=6");
    o.insert(o.end(), both.begin(), both.end());
    o.insert(o.end(), extra.begin(), extra.end());
    return o;
  };
  const std::vector<double> full = losses(world, with(dir + "/full", {}), "", false);
  ASSERT_EQ(full.size(), 6u);
  const std::string saved = dir + "/saved";
  losses(world, with(saved, {"parallel.pp=2", "parallel.ep=2", "train.save_every=3"}), "", true);
  const std::string ckpt = saved + "/step-000003";
  ASSERT_TRUE(std::filesystem::exists(ckpt + "/index.json"));
  auto expect_tail = [&](const std::vector<double>& tail, const std::string& label) {
    ASSERT_EQ(tail.size(), 3u) << label;
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(tail[i], full[3 + i], kLossTol * full[3 + i]) << label << ", step " << 4 + i;
  };
  expect_tail(losses(world, with(saved, {"parallel.pp=4"}), ckpt, false), "pp=4");
  expect_tail(losses(world, with(saved, {"parallel.pp=1", "parallel.ep=2"}), ckpt, false), "pp=1 x ep=2");
  if (world.rank() == 0) {
    LocalCommunicator one;
    expect_tail(losses(one, with(saved, {}), ckpt, false), "pp=1, one process");
  }
}

TEST_F(Pipeline, CheckpointSavedUnderTwoStagesTimesEp2ResumesUnderOneAndFourStages) {
  expect_resumes_under_other_topologies(*world_, dir_, {});
}
TEST_F(Pipeline, Fp8CheckpointSavedUnderTwoStagesTimesEp2ResumesUnderOneAndFourStages) {
  expect_resumes_under_other_topologies(*world_, dir_, {"train.precision=\"fp8\""});
}

}  // namespace
}  // namespace moe

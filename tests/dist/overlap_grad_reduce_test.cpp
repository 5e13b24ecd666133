// ranks: 2 4
// Gradient reduction overlapped with the backward (parallel.overlap_grad_reduce): on CPU ranks
// the buckets reduce-scattered on the worker thread while the last microbatch's backward runs
// give the weights, reduced gradient shards, losses and gradient norms of the reduction after the
// backward bit for bit, over several steps of 2 microbatches per rank, with dp only, ep = 2 and
// (4 ranks) dp 2 x ep 2, with many small buckets and with the default one per group; each bucket
// starts only after the backward of the lowest block it reads, and some start before the
// backward's end.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "../train/trainer_test_util.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/model/weights.h"
#include "moe/parallel/ddp_store.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

constexpr int kSteps = 3;

std::vector<std::string> overrides(int world, int ep, bool overlap, int64_t bucket_bytes) {
  std::vector<std::string> o = testing::tiny_moe_cpu_run(world, kSteps);
  o.insert(o.end(), {"parallel.ep=" + std::to_string(ep),
                     std::string("parallel.overlap_grad_reduce=") + (overlap ? "true" : "false"),
                     "parallel.grad_bucket_bytes=" + std::to_string(bucket_bytes)});
  return o;
}

struct RunResult {
  std::vector<double> losses, grad_norms;
  std::vector<float> weights, grad_shard;  // after the last step: FP32 weights, this rank's reduced gradient shard
  bool hooks = false;
};

std::vector<float> host_copy(const Tensor& t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); }

RunResult run(Communicator& world, int ep, bool overlap, int64_t bucket_bytes) {
  const Config cfg = load_config("tiny", overrides(world.size(), ep, overlap, bucket_bytes));
  Trainer t(cfg, testing::quiet_bench(), world);
  RunResult out;
  for (int64_t step = 0; step < kSteps; ++step) {
    const StepRecord r = t.train_step(step);
    out.losses.push_back(r.loss);
    out.grad_norms.push_back(r.grad_norm);
  }
  auto& store = dynamic_cast<DdpStore&>(t.store());
  out.weights = host_copy(store.params());
  out.grad_shard = host_copy(store.optimizer().grad_shard());
  out.hooks = store.hooks() != nullptr;
  return out;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Topology {
  int ep;
  int64_t bucket_bytes;
};
void PrintTo(const Topology& t, std::ostream* os) { *os << "ep " << t.ep << ", buckets of " << t.bucket_bytes << " bytes"; }

class OverlapGradReduce : public ::testing::TestWithParam<Topology> {
 protected:
  MpiCommunicator world_{MPI_COMM_WORLD};
};

TEST_P(OverlapGradReduce, OverlappedReductionGivesTheSameWeightsAndGradientsBitForBit) {
  const Topology topo = GetParam();
  if (world_.size() % topo.ep != 0) GTEST_SKIP() << "ep " << topo.ep << " does not divide " << world_.size();
  // The worker thread is used only under MPI_THREAD_MULTIPLE: without it this test would compare
  // the reduction after the backward with itself.
  ASSERT_TRUE(world_.threads_may_call_concurrently());
  const RunResult after = run(world_, topo.ep, /*overlap=*/false, topo.bucket_bytes);
  const RunResult overlapped = run(world_, topo.ep, /*overlap=*/true, topo.bucket_bytes);
  EXPECT_FALSE(after.hooks);
  EXPECT_TRUE(overlapped.hooks);
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_EQ(after.losses[s], overlapped.losses[s]) << "step " << s + 1;
    EXPECT_EQ(after.grad_norms[s], overlapped.grad_norms[s]) << "step " << s + 1;
  }
  EXPECT_TRUE(bit_equal(after.grad_shard, overlapped.grad_shard)) << "reduced gradient shard, rank " << world_.rank();
  EXPECT_TRUE(bit_equal(after.weights, overlapped.weights)) << "weights, rank " << world_.rank();
}

// 4 KiB buckets: dozens per group, started block by block; 16 MiB: one per group, after block 0.
INSTANTIATE_TEST_SUITE_P(Topologies, OverlapGradReduce,
                         ::testing::Values(Topology{1, 4096}, Topology{2, 4096}, Topology{1, int64_t{16} << 20},
                                           Topology{2, int64_t{16} << 20}),
                         [](const auto& info) {
                           return "ep" + std::to_string(info.param.ep) + "_bucket" +
                                  std::to_string(info.param.bucket_bytes);
                         });

TEST(OverlapGradReducePlan, EachBucketStartsOnceAfterTheBackwardOfTheLowestBlockItReads) {
  MpiCommunicator world(MPI_COMM_WORLD);
  const Config cfg = load_config("tiny", overrides(world.size(), 2, /*overlap=*/true, 4096));
  Trainer t(cfg, testing::quiet_bench(), world);
  const auto& store = dynamic_cast<const DdpStore&>(t.store());
  const DistributedAdamW& opt = store.optimizer();
  const ParamRegistry& reg = t.registry();
  const int blocks = static_cast<int>(cfg.model.num_hidden_layers) + 2;
  std::vector<int> starts(opt.buckets().size(), 0);
  int before_the_end = 0;  // buckets started before the last block's (the embedding's) backward
  for (int b = 0; b < blocks; ++b) {
    for (int i : store.buckets_started_after(b)) {
      ++starts.at(static_cast<size_t>(i));
      if (b > 0) ++before_the_end;
      int lowest = blocks;
      for (const auto& [begin, end] : opt.bucket_inputs(i))
        for (const ParamEntry& e : reg.entries())
          if (e.offset < end && e.offset + e.numel() > begin) lowest = std::min(lowest, param_block(cfg.model, e.name));
      EXPECT_EQ(lowest, b) << "bucket " << i;
    }
  }
  for (size_t i = 0; i < starts.size(); ++i) EXPECT_EQ(starts[i], 1) << "bucket " << i;
  EXPECT_GT(before_the_end, 0) << "no bucket overlaps the backward";
}

}  // namespace
}  // namespace moe

// ranks: 2 4
// ep.payload = "fp8" under expert parallelism on CPU ranks (the rowwise dispatcher over an MPI
// shared-memory heap). The dispatcher stores into every owner's expert_in exactly the FP8 codes and
// scales of the rows the bf16 payload moves, and counts the bytes it moves (codes + scales one way,
// F32 rows back). Whole training steps at ep = 2 and ep = world, both at train.precision = "fp8":
// payload fp8 gives payload bf16's losses and every gradient but the routed experts' gate/up bit
// for bit, that one within the tolerance stated in tests/model/fp8_payload_test.cpp, the step's
// dispatch bytes exactly (D + 4 ceil(D / 128) + 4 D) / (8 D) of bf16's, and every recompute mode
// the payload-fp8 gradients bit for bit.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "job_temp_dir_test.h"
#include "../train/trainer_test_util.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/core/arena.h"
#include "moe/ops/fp8.h"
#include "moe/ops/route.h"
#include "moe/parallel/dispatcher_factory.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

// ---------------------------------------------------------------------------------------------
// The dispatcher alone.

constexpr int64_t kTokens = 24, kTopK = 3, kHidden = 260;  // 260 columns: two whole tiles and a partial one

struct Dispatched {
  std::vector<int32_t> route_index, offsets;
  std::vector<uint8_t> codes;   // kept rows of expert_in (payload fp8)
  std::vector<float> scales;    // their scales (payload fp8)
  std::vector<float> rows;      // kept rows of expert_in (payload bf16: F32 on the CPU)
  int64_t bytes = 0, remote_bytes = 0;
  int64_t expert_rows = 0;  // rows of each rank's expert buffer
};

// One MoE layer's forward placement and dispatch through the rowwise dispatcher with `payload`, on
// this rank's random tokens (inputs span many binades, so the tiles' scales differ), then the rest
// of the layer's calls (combine, combine_backward, dispatch_backward) so that every rank makes the
// same collective calls.
Dispatched dispatch_layer(Communicator& comm, Payload payload, int64_t N, double capacity_factor) {
  const int64_t T = kTokens, K = kTopK, D = kHidden, tiles = (D + kFp8Tile - 1) / kFp8Tile;
  std::mt19937 rng(17u + 7919u * static_cast<uint32_t>(comm.rank()));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(T * D), weights(T * K, 0.5f), out(T * D, 0.0f), dout(T * D, 1.0f), dweights(T * K), dx(T * D);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(normal(rng), static_cast<int>(i % 19) - 9);
  std::vector<int32_t> topk;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> experts(N);
    for (int64_t e = 0; e < N; ++e) experts[e] = static_cast<int32_t>(e);
    std::shuffle(experts.begin(), experts.end(), rng);
    topk.insert(topk.end(), experts.begin(), experts.begin() + K);
  }

  auto disp = make_dispatcher("rowwise", comm, N, capacity_factor, /*dropless=*/false);
  const int64_t E = disp->local_experts();
  Arena arena("fp8_payload_ep_test");
  DispatchShape shape{T, K, D, 1, 1};
  shape.payload = payload;
  disp->reserve_buffers(shape, arena);
  arena.commit();

  Dispatched r;
  r.route_index.assign(T * K, -7);
  r.offsets.assign(E + 1, -7);
  std::vector<int32_t> counts(N);
  const RoutePlan plan{i32_tensor(r.route_index.data(), {T * K}), i32_tensor(r.offsets.data(), {E + 1})};
  const Tensor topk_t = i32_tensor(topk.data(), {T, K}), x_t = f32_tensor(x.data(), {T, D});
  Lease lease = disp->acquire(0);
  route_counts(i32_tensor(counts.data(), {N}), topk_t);
  disp->place_routes(0, plan, topk_t, i32_tensor(counts.data(), {N}), {});
  if (payload == Payload::FP8) {
    EXPECT_TRUE(lease.buffers.fp8_input());
    disp->dispatch_fp8(lease.buffers.fp8_expert_in(), x_t, plan, static_cast<int>(K), {});
  } else {
    EXPECT_FALSE(lease.buffers.fp8_input());
    disp->dispatch(lease.buffers.expert_in, x_t, plan, static_cast<int>(K), {});
  }
  const int64_t kept = r.offsets[E];
  r.expert_rows = disp->expert_rows(T, K);
  if (payload == Payload::FP8) {
    const auto* codes = static_cast<const uint8_t*>(lease.buffers.expert_in.data);
    r.codes.assign(codes, codes + kept * D);
    r.scales.assign(lease.buffers.expert_in_scales.f32(), lease.buffers.expert_in_scales.f32() + kept * tiles);
  } else {
    r.rows.assign(lease.buffers.expert_in.f32(), lease.buffers.expert_in.f32() + kept * D);
  }
  std::fill(lease.buffers.expert_out.f32(), lease.buffers.expert_out.f32() + lease.buffers.expert_out.numel(), 1.0f);
  disp->combine(f32_tensor(out.data(), {T, D}), lease.buffers.expert_out, f32_tensor(weights.data(), {T, K}), plan,
                static_cast<int>(K), {});
  const ExpertBuffers grad = disp->grad_buffers();
  disp->combine_backward(grad.expert_out, f32_tensor(dweights.data(), {T, K}), f32_tensor(dout.data(), {T, D}),
                         lease.buffers.expert_out, f32_tensor(weights.data(), {T, K}), plan, static_cast<int>(K), {});
  disp->dispatch_backward(f32_tensor(dx.data(), {T, D}), grad.expert_in, plan, static_cast<int>(K), {});
  disp->release(lease);
  r.bytes = disp->bytes_moved();
  r.remote_bytes = disp->remote_bytes_moved();
  return r;
}

class Fp8PayloadEp : public testing::JobTempDirTest {
 protected:
};

// Every owner's expert_in holds, row for row, fp8_quantize_rows of the rows the bf16 payload puts
// there (codes and scales bit for bit), under drops (capacity factor 0.75). Bytes: every kept route
// of this rank moves D codes and ceil(D / 128) F32 scales in dispatch and D F32 back in combine.
TEST_F(Fp8PayloadEp, RowwiseStoresTheQuantizedRowsOfTheBf16DispatchAndCountsCodesAndScales) {
  const int64_t N = 4 * world_->size(), D = kHidden, tiles = (D + kFp8Tile - 1) / kFp8Tile;
  const Dispatched bf16 = dispatch_layer(*world_, Payload::BF16, N, 0.75);
  const Dispatched fp8 = dispatch_layer(*world_, Payload::FP8, N, 0.75);
  ASSERT_EQ(bf16.route_index, fp8.route_index);
  ASSERT_EQ(bf16.offsets, fp8.offsets);
  const int64_t kept = fp8.offsets.back();
  ASSERT_GT(kept, 0);
  std::vector<float> rows = bf16.rows;
  std::vector<uint8_t> codes(kept * D);
  std::vector<float> scales(kept * tiles);
  fp8_quantize_rows(Fp8Tensor{Tensor(codes.data(), DType::FP8_E4M3, {kept, D}), f32_tensor(scales.data(), {kept, tiles}),
                              Fp8Tiles::Rows},
                    f32_tensor(rows.data(), {kept, D}));
  EXPECT_EQ(codes, fp8.codes) << "rank " << world_->rank() << ": the moved codes are not the quantized rows";
  EXPECT_EQ(0, std::memcmp(scales.data(), fp8.scales.data(), scales.size() * sizeof(float)))
      << "rank " << world_->rank() << ": the moved scales are not the quantized rows' scales";

  // route_index holds owner * expert_rows + row.
  int64_t routes = 0, remote = 0;
  for (int32_t v : fp8.route_index) {
    if (v < 0) continue;
    ++routes;
    if (v / fp8.expert_rows != world_->rank()) ++remote;
  }
  ASSERT_LT(routes, kTokens * kTopK) << "the capacity factor should drop routes";
  const int64_t fp8_route = D + 4 * tiles + 4 * D, bf16_route = 8 * D;
  EXPECT_EQ(fp8.bytes, routes * fp8_route);
  EXPECT_EQ(fp8.remote_bytes, remote * fp8_route);
  EXPECT_EQ(bf16.bytes, routes * bf16_route);
  EXPECT_EQ(bf16.remote_bytes, remote * bf16_route);
}

// ---------------------------------------------------------------------------------------------
// Whole training steps.

std::vector<std::string> base_overrides(const std::string& run_dir, int world) {
  return {"run.device=\"cpu\"",
          "model.hidden_size=160",  // a whole 1 x 128 tile and a partial one per row
          "model.intermediate_size=16",
          "model.num_experts=8",
          "model.num_experts_per_tok=2",
          "model.capacity_factor=0.75",
          "train.seq_len=16",
          "train.micro_batch_size=1",
          "train.global_batch_size=" + std::to_string(2 * world),  // 2 microbatches per rank
          "train.warmup_steps=1",
          "train.steps=2",
          "train.eval_every=0",
          "train.eval_batches=0",
          "train.precision=\"fp8\"",
          "run.save_final=false",
          "data.synthetic_tokens=20000",
          "data.synthetic_eval_tokens=2000",
          "run.dir=\"" + run_dir + "\""};
}

struct RunResult {
  std::map<std::string, std::vector<float>> grads;  // step 1's reduced gradient pieces (unheld: NaN)
  std::vector<double> losses;
  double first_step_bytes = 0;  // dispatch + combine payload of step 1, all ranks
};

RunResult run(Communicator& world, const std::vector<std::string>& overrides) {
  const Config cfg = load_config("tiny", overrides);
  RunResult out;
  Trainer t(cfg, testing::quiet_bench(), world);
  for (int64_t step = 0; step < cfg.train.steps; ++step) {
    if (step == 0) out.grads = testing::step_gradients(t, step, std::nanf(""));
    const StepRecord r = t.train_step(step);
    out.losses.push_back(r.loss);
    if (step == 0) out.first_step_bytes = r.dispatch_bytes;
  }
  return out;
}

std::vector<int> ep_degrees(int world) {
  std::vector<int> eps = {2};
  if (world != 2) eps.push_back(world);
  return eps;
}

// Relative L2 distance over the elements this rank holds (NaN in both: not held).
double held_distance(const std::vector<float>& want, const std::vector<float>& got) {
  double d = 0, n = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i]) && std::isnan(got[i])) continue;
    d += (static_cast<double>(got[i]) - want[i]) * (got[i] - want[i]);
    n += static_cast<double>(want[i]) * want[i];
  }
  return n == 0 ? std::sqrt(d) : std::sqrt(d / n);
}

TEST_F(Fp8PayloadEp, StepsMatchPayloadBf16ExceptTheExpertGateUpGradientAndMoveTheFp8Bytes) {
  const int P = world_->size();
  const double D = 160, tiles = 2;
  for (int ep : ep_degrees(P)) {
    std::vector<std::string> o = base_overrides(dir_ + "/run", P);
    o.push_back("parallel.ep=" + std::to_string(ep));
    std::vector<std::string> bf16 = o, fp8 = o;
    bf16.push_back("ep.payload=\"bf16\"");
    fp8.push_back("ep.payload=\"fp8\"");
    const RunResult want = run(*world_, bf16), got = run(*world_, fp8);
    const std::string label = "ep " + std::to_string(ep) + ", rank " + std::to_string(world_->rank());
    // The first step's forward and routing are the same, so its loss and bytes follow exactly; the
    // second step's weights differ by the first update's gate/up change.
    EXPECT_EQ(want.losses[0], got.losses[0]) << label;
    EXPECT_NEAR(want.losses[1], got.losses[1], 1e-3 * std::abs(want.losses[1])) << label;
    ASSERT_GT(want.first_step_bytes, 0) << label;
    EXPECT_EQ(got.first_step_bytes, want.first_step_bytes * (D + 4 * tiles + 4 * D) / (8 * D)) << label;
    ASSERT_EQ(want.grads.size(), got.grads.size()) << label;
    for (const auto& [name, g] : want.grads) {
      const std::vector<float>& h = got.grads.at(name);
      ASSERT_EQ(g.size(), h.size()) << label << ": " << name;
      if (name.find("mlp.experts.gate_up_proj") == std::string::npos) {
        EXPECT_EQ(0, std::memcmp(g.data(), h.data(), g.size() * sizeof(float))) << label << ": gradient of " << name;
        continue;
      }
      const double d = held_distance(g, h);
      if (world_->rank() == 0) std::printf("  %s: %s payload fp8 vs bf16 distance %.3e\n", label.c_str(), name.c_str(), d);
      EXPECT_LE(d, 1e-3) << label << ": gradient of " << name;  // tests/model/fp8_payload_test.cpp states why
    }
  }
}

// Block recompute re-dispatches the FP8 rows collectively in backward into the shared recompute pair.
TEST_F(Fp8PayloadEp, EveryRecomputeModeGivesThePayloadFp8GradientsBitForBit) {
  const int P = world_->size();
  for (int ep : ep_degrees(P)) {
    std::vector<std::string> o = base_overrides(dir_ + "/run", P);
    o.push_back("parallel.ep=" + std::to_string(ep));
    o.push_back("ep.payload=\"fp8\"");
    const RunResult want = run(*world_, o);
    for (const std::string mode : {"experts", "attention", "block"}) {
      std::vector<std::string> with = o;
      with.push_back("train.recompute=\"" + mode + "\"");
      const RunResult got = run(*world_, with);
      const std::string label = "ep " + std::to_string(ep) + ", recompute = " + mode + ", rank " +
                                std::to_string(world_->rank());
      for (const auto& [name, g] : want.grads) {
        ASSERT_TRUE(got.grads.count(name)) << label << ": " << name;
        EXPECT_EQ(0, std::memcmp(g.data(), got.grads.at(name).data(), g.size() * sizeof(float)))
            << label << ": gradient of " << name;
      }
      EXPECT_EQ(want.losses, got.losses) << label;
    }
  }
}

}  // namespace
}  // namespace moe

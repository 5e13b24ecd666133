// ep.payload = "fp8" on one CPU rank (the local dispatcher; model/dispatch.h): against payload bf16,
// both at train.precision = "fp8", the forward is bit-equal (the moved FP8 rows are the operand
// the expert GEMM would have quantized), every gradient but the routed experts' gate/up weight
// gradient is bit-equal, and that one (quantized along the tokens from the dequantized FP8 rows,
// which differs only for values in E4M3's subnormal range) stays within a stated tolerance; recompute still gives the payload-fp8 gradients bit for bit;
// the expert buffers shrink by what the FP8 rows save; configs the payload cannot run are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../train/train_test_util.h"
#include "../train/trainer_test_util.h"
#include "moe/ops/fp8.h"
#include "moe/train/trainer.h"

namespace moe {
namespace {

using testing::Gradients;
using testing::local_world;
using testing::quiet_bench;
using testing::small_config;
using testing::step_gradients;
using testing::TempDir;

struct Case {
  std::string name;
  std::vector<std::string> overrides;
};

// On top of small_config (d_model 32: one partial 1 x 128 tile per row), and one with d_model 160
// (a whole tile and a partial one).
const std::vector<Case> kCases = {
    {"learned_routing_with_drops", {"model.capacity_factor=0.75"}},
    {"shared_expert_and_dense_first_layer",
     {"model.num_hidden_layers=3", "model.first_k_dense_replace=1", "model.dense_intermediate_size=48",
      "model.shared_expert_intermediate_size=24", "model.capacity_factor=1.0"}},
    {"two_tiles_per_row_dropless", {"model.hidden_size=160", "model.dropless=true"}},
};

Config payload_config(const std::string& dir, const Case& c, const std::string& payload,
                      std::vector<std::string> extra = {}) {
  std::vector<std::string> o = c.overrides;
  o.push_back("train.precision=\"fp8\"");
  o.push_back("ep.payload=\"" + payload + "\"");
  o.insert(o.end(), extra.begin(), extra.end());
  return small_config(dir, o);
}

bool is_expert_gate_up(const std::string& name) { return name.find("mlp.experts.gate_up_proj") != std::string::npos; }

double relative_distance(const std::vector<float>& want, const std::vector<float>& got) {
  double d = 0, n = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d += (static_cast<double>(got[i]) - want[i]) * (got[i] - want[i]);
    n += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(d) / std::max(std::sqrt(n), 1e-30);
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class Fp8Payload : public ::testing::TestWithParam<Case> {};

// The gate/up weight gradient's x operand: payload bf16 quantizes the rows x along the tokens;
// payload fp8 quantizes the dequantized 1 x 128 row tiles of x along the tokens. With power-of-two
// scales both give the same values for every element that is an E4M3 normal number in its row and
// column tiles (tests/unit/test_fp8.cpp,
// columns_of_dequantized_row_tiles_equal_columns_of_the_rows_where_values_are_normal); only
// elements below 2^-6 of a tile's scale (about 2^-14 of its largest value) may differ, by about
// 2^-10 of that tile's scale. Measured on these cases: bit-equal (distance 0; 4.7e-8 in one layer of
// tests/dist/fp8_payload_ep_test.cpp at EP 2). Bar: 1e-3 relative L2,
// room for activations whose row tiles hold outliers (more elements in the subnormal range). A
// wrong tile, scale or row (codes of another token, scales of another tile) is off by ~100%.
constexpr double kGateUpTolerance = 1e-3;

TEST_P(Fp8Payload, ForwardAndEveryGradientButExpertGateUpAreBitEqualToPayloadBf16) {
  const Case& c = GetParam();
  TempDir dir;
  Trainer bf16(payload_config(dir.path, c, "bf16"), quiet_bench(), local_world());
  Trainer fp8(payload_config(dir.path, c, "fp8"), quiet_bench(), local_world());
  ASSERT_EQ(fp8.model().payload(), Payload::FP8);
  const double loss_bf16 = bf16.microbatch_loss(0), loss_fp8 = fp8.microbatch_loss(0);
  EXPECT_EQ(loss_bf16, loss_fp8) << c.name << ": the forward loss differs";
  const Gradients want = step_gradients(bf16, 0), got = step_gradients(fp8, 0);
  ASSERT_EQ(want.size(), got.size());
  int gate_up_tensors = 0;
  for (const auto& [name, g] : want) {
    const std::vector<float>& h = got.at(name);
    ASSERT_EQ(g.size(), h.size()) << name;
    if (!is_expert_gate_up(name)) {
      EXPECT_TRUE(bit_equal(g, h)) << c.name << ": gradient of " << name << " differs";
      continue;
    }
    ++gate_up_tensors;
    const double d = relative_distance(g, h);
    std::printf("  %s: %s payload fp8 vs bf16 relative distance %.3e\n", c.name.c_str(), name.c_str(), d);
    EXPECT_LE(d, kGateUpTolerance) << c.name << ": gradient of " << name;
  }
  EXPECT_GT(gate_up_tensors, 0) << "no routed-expert gate/up gradient found";
}

// Recompute runs the same ops on the same inputs (block recompute re-dispatches the FP8 rows into
// the shared recompute pair): the payload-fp8 gradients are bit-equal under every mode.
TEST_P(Fp8Payload, RecomputeGivesThePayloadFp8GradientsBitForBit) {
  const Case& c = GetParam();
  TempDir dir;
  Trainer none(payload_config(dir.path, c, "fp8"), quiet_bench(), local_world());
  const Gradients want = step_gradients(none, 0);
  for (const char* r : {"experts", "attention", "block"}) {
    Trainer t(payload_config(dir.path, c, "fp8", {std::string("train.recompute=\"") + r + "\""}), quiet_bench(),
              local_world());
    const Gradients got = step_gradients(t, 0);
    for (const auto& [name, g] : want)
      EXPECT_TRUE(bit_equal(g, got.at(name))) << c.name << ", recompute = " << r << ": gradient of " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, Fp8Payload, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The expert buffers of a run, to the byte: per MoE layer and lease slot (or once, for the shared
// recompute pair) expert_in and expert_out, plus the backward pair; the CPU moves F32 rows. With
// payload fp8 expert_in is D one-byte codes and ceil(D / 128) F32 scales per row instead of D F32.
// On one rank payload bf16 holds the same FP8 expert_in (every route stays local: the backward
// quantizes from the token rows, tests/model/fp8_gathered_test.cpp), and its backward pair has no
// d(expert output) buffer.
TEST(Fp8PayloadMemory, ExpertBuffersHoldCodesAndScalesInsteadOfActivationRows) {
  TempDir dir;
  for (const char* recompute : {"none", "block"}) {
    const Case c{"two_tiles", {"model.hidden_size=160", "model.num_hidden_layers=3", "parallel.lease_slots=2",
                               std::string("train.recompute=\"") + recompute + "\""}};
    for (const std::string payload : {"bf16", "fp8"}) {
      const Config cfg = payload_config(dir.path, c, payload);
      Trainer t(cfg, quiet_bench(), local_world());
      const int64_t D = cfg.model.hidden_size, rows = t.model().expert_rows(), tiles = (D + kFp8Tile - 1) / kFp8Tile;
      const int64_t pairs = std::string(recompute) == "block" ? 1 : cfg.model.num_hidden_layers * cfg.parallel.lease_slots;
      const int64_t row_f32 = rows * D * 4;
      const int64_t expert_in = rows * D + rows * tiles * 4;
      const int64_t grad_pair = payload == "fp8" ? 2 * row_f32 : row_f32;
      const auto want = static_cast<size_t>(pairs * (expert_in + row_f32) + grad_pair);
      EXPECT_EQ(t.memory_plan().expert_buffers, want) << "payload " << payload << ", recompute " << recompute;
    }
  }
}

TEST(Fp8PayloadConfig, Bf16PrecisionIsRefusedNamingBothKeys) {
  TempDir dir;
  try {
    small_config(dir.path, {"ep.payload=\"fp8\""});
    ADD_FAILURE() << "payload fp8 with precision bf16 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ep.payload"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train.precision"), std::string::npos) << e.what();
  }
}

TEST(Fp8PayloadConfig, AlltoallUnderExpertParallelismIsRefusedNamingBothKeys) {
  TempDir dir;
  try {
    small_config(dir.path, {"train.precision=\"fp8\"", "ep.payload=\"fp8\"", "parallel.ep=2",
                            "ep.backend=\"alltoall\"", "train.global_batch_size=8"});
    ADD_FAILURE() << "payload fp8 with the alltoall backend was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ep.payload"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ep.backend"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moe

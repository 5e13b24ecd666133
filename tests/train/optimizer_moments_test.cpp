// AdamW moments stored in BF16 (optim.moment_dtype = "bf16") in the parameter stores: the memory
// plan's optimizer bytes, and checkpoints that hold the moments in their stored dtype and load
// under either setting (FP32 -> BF16 rounds to nearest even, BF16 -> FP32 is exact).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moe/ckpt/checkpoint.h"
#include "moe/comm/local_communicator.h"
#include "moe/comm/mesh.h"
#include "moe/core/arena.h"
#include "moe/core/rng.h"
#include "moe/model/weights.h"
#include "moe/parallel/ddp_store.h"
#include "moe/parallel/fsdp_store.h"
#include "moe/train/config.h"
#include "moe/train/flops.h"
#include "train_test_util.h"

namespace moe {
namespace {

ModelConfig small_model() { return testing::small_config("unused").model; }

// One rank's DdpStore (or FsdpStore) on the CPU with moments in `moments`.
struct StoreRun {
  LocalCommunicator world;
  Arena arena{"model state"};
  ParamRegistry reg;
  std::unique_ptr<Mesh> mesh;
  std::unique_ptr<ParamStore> store;

  StoreRun(const ModelConfig& mc, DType moments, bool fsdp = false) {
    if (fsdp) {
      reg = build_registry(mc, 0, mc.num_experts, ParamLayout::ByBlock);
      store = std::make_unique<FsdpStore>(mc, reg, world, arena, moments);
    } else {
      mesh = std::make_unique<Mesh>(make_mesh(world, 1, mc.num_experts));
      reg = build_registry(mc, 0, mc.num_experts, ParamLayout::ByReplicaGroup);
      store = std::make_unique<DdpStore>(mc, reg, *mesh, arena, moments);
    }
  }

  // Steps 1..steps of AdamW with gradients keyed by (block, tensor, element, step), written through
  // the model's gradient views (for FSDP inside each block's backward window, as the model does).
  void train(int64_t steps) {
    AdamWConfig cfg;
    cfg.lr = 1e-2f;
    cfg.weight_decay = 0.1f;
    const int blocks = static_cast<int>(store->weights().layers.size()) + 2;
    for (int64_t step = 1; step <= steps; ++step) {
      store->zero_grads(false);
      for (int b = 0; b < blocks; ++b) {
        if (store->hooks()) store->hooks()->before_backward(b);
        int t = 0;
        for (const Tensor& g : block_tensors(store->grads(), b)) {
          for (int64_t j = 0; j < g.numel(); ++j) {
            Rng rng(hash_counters(7, static_cast<uint64_t>(b * 64 + t), static_cast<uint64_t>(j),
                                  static_cast<uint64_t>(step)));
            g.f32()[j] = static_cast<float>(0.01 * rng.normal());
          }
          ++t;
        }
        if (store->hooks()) store->hooks()->after_backward(b);
      }
      ASSERT_FALSE(store->step(cfg, 1.0f, step).skipped);
    }
  }

  // The tensors of block b (0: embedding, 1 + l: layer l, L + 1: final norm and LM head).
  static std::vector<Tensor> block_tensors(const ModelWeights& w, int b) {
    const int L = static_cast<int>(w.layers.size());
    std::vector<Tensor> all;
    if (b == 0) all = {w.embed};
    if (b == L + 1) all = {w.final_norm, w.lm_head};
    if (b >= 1 && b <= L) {
      const LayerWeights& l = w.layers[static_cast<size_t>(b - 1)];
      all = {l.input_norm,      l.q_proj,       l.k_proj,         l.v_proj,      l.o_proj,
             l.q_norm,          l.k_norm,       l.post_norm,      l.router,      l.experts_gate_up,
             l.experts_down,    l.shared_gate_up, l.shared_down,  l.mlp_gate_up, l.mlp_down};
    }
    std::vector<Tensor> present;
    for (const Tensor& t : all)
      if (!t.empty()) present.push_back(t);
    return present;
  }

  // Every slice this rank would save, by key.
  std::map<std::string, CheckpointSlice> slices() const {
    std::map<std::string, CheckpointSlice> out;
    for (const CheckpointSlice& s : store->checkpoint_slices()) out[s.key] = s;
    return out;
  }
};

std::vector<uint16_t> bf16_values(const CheckpointSlice& s) {
  EXPECT_EQ(s.dtype, DType::BF16) << s.key;
  const auto* p = static_cast<const uint16_t*>(s.data);
  return std::vector<uint16_t>(p, p + (s.end - s.begin));
}
std::vector<float> f32_values(const CheckpointSlice& s) {
  EXPECT_EQ(s.dtype, DType::F32) << s.key;
  const auto* p = static_cast<const float*>(s.data);
  return std::vector<float>(p, p + (s.end - s.begin));
}
bool is_moment(const std::string& key) {
  return key.size() > 8 && (key.ends_with(".exp_avg") || key.ends_with(".exp_avg_sq"));
}

// The optimizer's share of the memory plan is exact from the parameter count n: FP32 moments take
// 2 x 4 n bytes, BF16 moments 2 x 2 n (half), plus the 4-byte squared-norm scalar (the CPU's norm
// needs no workspace). DdpStore counts under the "optimizer." role the start-up printout sums; the
// FSDP store's moments (one rank: shards of every parameter) halve the same way.
TEST(OptimizerMoments, bf16_moments_halve_the_optimizer_bytes_of_the_memory_plan) {
  const ModelConfig mc = small_model();
  const int64_t n = static_cast<int64_t>(count_flops(mc, 32).total_params);
  StoreRun f32(mc, DType::F32), bf16(mc, DType::BF16);
  ASSERT_EQ(f32.reg.total_numel(), n);
  EXPECT_EQ(f32.arena.bytes_with_prefix("optimizer."), static_cast<size_t>(8 * n + 4));
  EXPECT_EQ(bf16.arena.bytes_with_prefix("optimizer."), static_cast<size_t>(4 * n + 4));
  EXPECT_EQ(bf16.arena.bytes_with_prefix("optimizer.exp_avg") * 2, f32.arena.bytes_with_prefix("optimizer.exp_avg"));
  // Nothing else in the plan changes (bytes_with_prefix(""): every buffer, without alignment padding).
  EXPECT_EQ(f32.arena.bytes_with_prefix("") - f32.arena.bytes_with_prefix("optimizer."),
            bf16.arena.bytes_with_prefix("") - bf16.arena.bytes_with_prefix("optimizer."));

  StoreRun fsdp_f32(mc, DType::F32, true), fsdp_bf16(mc, DType::BF16, true);
  EXPECT_EQ(fsdp_f32.arena.bytes_with_prefix("fsdp.exp_avg"), static_cast<size_t>(8 * n));
  EXPECT_EQ(fsdp_bf16.arena.bytes_with_prefix("fsdp.exp_avg"), static_cast<size_t>(4 * n));
}

// Moments are saved in the dtype they are stored in and load under either setting: a checkpoint of
// FP32 moments loads into BF16 moments rounded to nearest even, one of BF16 moments into FP32
// moments exactly and into BF16 moments unchanged; the FP32 weights load exactly every time. For
// the resident store (DdpStore) and the FSDP store.
TEST(OptimizerMoments, checkpoints_keep_the_stored_moment_dtype_and_load_under_either) {
  const ModelConfig mc = small_model();
  for (bool fsdp : {false, true}) {
    SCOPED_TRACE(fsdp ? "fsdp" : "ddp");
    testing::TempDir dir;
    StoreRun f32(mc, DType::F32, fsdp), bf16(mc, DType::BF16, fsdp);
    for (StoreRun* r : {&f32, &bf16}) {
      r->arena.commit();
      r->store->init(42);
      r->train(3);
    }
    const nlohmann::json state = nlohmann::json::object();
    const std::string f32_ckpt = save_checkpoint(dir.path + "/f32", 3, f32.store->checkpoint_slices(), state);
    const std::string bf16_ckpt = save_checkpoint(dir.path + "/bf16", 3, bf16.store->checkpoint_slices(), state);
    const CheckpointReader f32_reader(f32_ckpt), bf16_reader(bf16_ckpt);
    int moments = 0;
    for (const auto& [key, s] : f32.slices()) {
      EXPECT_EQ(f32_reader.dtype(key), DType::F32) << key;
      EXPECT_EQ(bf16_reader.dtype(key), is_moment(key) ? DType::BF16 : DType::F32) << key;
      moments += is_moment(key) ? 1 : 0;
    }
    EXPECT_EQ(moments, 2 * static_cast<int>(f32.reg.entries().size()));

    // FP32 -> BF16: rounded to nearest even.
    StoreRun to_bf16(mc, DType::BF16, fsdp);
    to_bf16.arena.commit();
    to_bf16.store->init(7);  // other weights, so the load must overwrite them
    to_bf16.store->load(f32_reader);
    const auto saved = f32.slices();
    for (const auto& [key, s] : to_bf16.slices()) {
      const std::vector<float> want = f32_values(saved.at(key));
      if (!is_moment(key)) {
        EXPECT_EQ(f32_values(s), want) << key;
        continue;
      }
      const std::vector<uint16_t> got = bf16_values(s);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], f32_to_bf16(want[i])) << key << " element " << i;
    }

    // BF16 -> FP32: exact; BF16 -> BF16: unchanged.
    StoreRun to_f32(mc, DType::F32, fsdp), same(mc, DType::BF16, fsdp);
    for (StoreRun* r : {&to_f32, &same}) {
      r->arena.commit();
      r->store->init(7);
      r->store->load(bf16_reader);
    }
    const auto saved_bf16 = bf16.slices(), as_bf16 = same.slices();
    for (const auto& [key, s] : to_f32.slices()) {
      const CheckpointSlice& b = saved_bf16.at(key);
      if (!is_moment(key)) {
        EXPECT_EQ(f32_values(s), f32_values(b)) << key;
        continue;
      }
      const std::vector<uint16_t> want = bf16_values(b);
      const std::vector<float> got = f32_values(s);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], bf16_to_f32(want[i])) << key << " element " << i;
      EXPECT_EQ(bf16_values(as_bf16.at(key)), want) << key;
    }
  }
}

}  // namespace
}  // namespace moe

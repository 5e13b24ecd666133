// FP8 with every route on one rank (TokenDispatcher::routes_stay_local; model/transformer.h,
// gathered_expert_grads_): the dispatch stores FP8 rows, the expert backward quantizes its operands
// from the token rows (moe/ops/fp8_gather.h) and neither the BF16 expert input nor d(expert output)
// is stored. Against the same model through a dispatcher that hides its locality (so the model
// dispatches BF16 rows, the expert product quantizes them, combine_backward stores d(expert
// output) and the quantizers read the stored rows): the losses and every gradient bit for bit,
// under every recompute mode, with dropped routes, a shared expert and a dense first layer; and the
// expert buffers hold FP8 input rows and no d(expert output) buffer.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "moe/core/arena.h"
#include "moe/core/rng.h"
#include "moe/model/fp8_weights.h"
#include "moe/model/transformer.h"
#include "moe/model/weights.h"
#include "moe/ops/elementwise.h"
#include "moe/parallel/local_dispatcher.h"
#include "moe/train/config.h"

namespace moe {
namespace {

// The local dispatcher, except that it does not say its routes stay local.
class HiddenLocality final : public TokenDispatcher {
 public:
  explicit HiddenLocality(TokenDispatcher& d) : d_(d) {}
  const char* name() const override { return d_.name(); }
  int64_t expert_rows(int64_t tokens, int64_t top_k) const override { return d_.expert_rows(tokens, top_k); }
  int64_t first_expert() const override { return d_.first_expert(); }
  int64_t local_experts() const override { return d_.local_experts(); }
  void reserve_buffers(const DispatchShape& shape, Arena& arena) override { d_.reserve_buffers(shape, arena); }
  Lease acquire(int layer) override { return d_.acquire(layer); }
  void release(const Lease& lease) override { d_.release(lease); }
  ExpertBuffers grad_buffers() override { return d_.grad_buffers(); }
  ExpertBuffers recompute_buffers() override { return d_.recompute_buffers(); }
  void place_routes(int layer, const RoutePlan& plan, Tensor topk_idx, Tensor counts, Stream s) override {
    d_.place_routes(layer, plan, topk_idx, counts, s);
  }
  void dispatch(Tensor in, Tensor x, const RoutePlan& plan, int top_k, Stream s) override {
    d_.dispatch(in, x, plan, top_k, s);
  }
  void dispatch_fp8(Fp8Tensor in, Tensor x, const RoutePlan& plan, int top_k, Stream s) override {
    d_.dispatch_fp8(in, x, plan, top_k, s);
  }
  void combine(Tensor out, Tensor y, Tensor w, const RoutePlan& plan, int top_k, Stream s) override {
    d_.combine(out, y, w, plan, top_k, s);
  }
  void combine_backward(Tensor dy, Tensor dw, Tensor dout, Tensor y, Tensor w, const RoutePlan& plan, int top_k,
                        Stream s) override {
    d_.combine_backward(dy, dw, dout, y, w, plan, top_k, s);
  }
  void dispatch_backward(Tensor dx, Tensor din, const RoutePlan& plan, int top_k, Stream s) override {
    d_.dispatch_backward(dx, din, plan, top_k, s);
  }

 private:
  TokenDispatcher& d_;
};

struct Result {
  double lm_loss = 0, lb_loss = 0, z_loss = 0;
  std::vector<float> grads;
  size_t expert_in_bytes = 0, grad_bytes = 0;
};

// One forward and backward of a fixed batch at FP8 with the given dispatcher locality.
Result run(const ModelConfig& mc, Recompute recompute, bool hide_locality) {
  const int64_t B = 2, T = 32, R = B * T;
  const ParamRegistry reg = build_registry(mc, 0, mc.num_experts);
  Arena state("state"), acts("activations");
  const auto params_slot = state.reserve("params", DType::F32, {reg.total_numel()});
  const auto grads_slot = state.reserve("grads", DType::F32, {reg.total_numel()});
  const auto tokens_slot = state.reserve("tokens", DType::I32, {R});
  const auto targets_slot = state.reserve("targets", DType::I32, {R});
  Fp8WeightCache cache(mc, mc.num_experts, state);
  LocalDispatcher local(mc.num_experts, mc.capacity_factor, mc.dropless);
  HiddenLocality hidden(local);
  TokenDispatcher& dispatcher = hide_locality ? static_cast<TokenDispatcher&>(hidden) : local;
  Transformer model(mc, B, T, acts, dispatcher, 1, recompute, Precision::FP8, Payload::BF16);
  state.commit();
  acts.commit();
  const Tensor params = state.get(params_slot), grads = state.get(grads_slot);
  init_params(mc, reg, params, 11);
  Rng rng(12);
  int32_t* tokens = state.get(tokens_slot).i32();
  int32_t* targets = state.get(targets_slot).i32();
  for (int64_t i = 0; i < R; ++i) tokens[i] = rng.below(static_cast<int>(mc.vocab_size));
  for (int64_t i = 0; i < R; ++i) targets[i] = i + 1 < R ? tokens[i + 1] : 0;
  const ModelWeights w = bind_weights(mc, reg, params), g = bind_weights(mc, reg, grads);
  cache.refresh(w);
  model.set_fp8_weights(&cache);
  fill_zero(grads);
  const int64_t moe_layers = mc.num_hidden_layers - mc.first_k_dense_replace;
  const StepScales scales{1.0f / static_cast<float>(R), 1.0f / static_cast<float>(moe_layers), true};
  model.forward_backward(w, g, state.get(tokens_slot), state.get(targets_slot), scales, 0, RoutingState{});
  Result r;
  const MicrobatchLosses l = model.losses();
  r.lm_loss = l.lm_loss_sum, r.lb_loss = l.lb_loss, r.z_loss = l.z_loss;
  r.grads.assign(grads.f32(), grads.f32() + grads.numel());
  r.expert_in_bytes = acts.bytes_with_prefix("dispatch.layer.") + acts.bytes_with_prefix("dispatch.recompute.");
  r.grad_bytes = acts.bytes_with_prefix("dispatch.grad.");
  return r;
}

struct Case {
  std::string name;
  std::vector<std::string> overrides;
};
const std::vector<Case> kCases = {
    {"learned_routing_with_drops", {"model.capacity_factor=0.75"}},
    {"shared_expert_and_dense_first_layer",
     {"model.num_hidden_layers=3", "model.first_k_dense_replace=1", "model.dense_intermediate_size=48",
      "model.shared_expert_intermediate_size=24", "model.capacity_factor=1.0"}},
    {"two_tiles_per_row_dropless", {"model.hidden_size=160", "model.dropless=true"}},
};

class Fp8Gathered : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8Gathered, LossesAndEveryGradientAreThoseOfTheStoredRowsBitForBit) {
  std::vector<std::string> o = {"model.hidden_size=32", "model.intermediate_size=32"};
  o.insert(o.end(), GetParam().overrides.begin(), GetParam().overrides.end());
  const ModelConfig mc = load_config("tiny", o).model;
  for (Recompute rc : {Recompute::None, Recompute::Experts, Recompute::Attention, Recompute::Block}) {
    SCOPED_TRACE(GetParam().name + ", recompute " + to_string(rc));
    const Result want = run(mc, rc, /*hide_locality=*/true), got = run(mc, rc, /*hide_locality=*/false);
    EXPECT_EQ(want.lm_loss, got.lm_loss);
    EXPECT_EQ(want.lb_loss, got.lb_loss);
    EXPECT_EQ(want.z_loss, got.z_loss);
    ASSERT_EQ(want.grads.size(), got.grads.size());
    EXPECT_EQ(0, std::memcmp(want.grads.data(), got.grads.data(), want.grads.size() * sizeof(float)))
        << "the gradients differ";
    // CPU rows are F32: the gathered run's expert input holds 1-byte codes and F32 scales per 128
    // (less than a quarter of F32 rows), and its backward pair has no d(expert output) (half).
    EXPECT_LT(got.expert_in_bytes, want.expert_in_bytes);
    EXPECT_EQ(2 * got.grad_bytes, want.grad_bytes);
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, Fp8Gathered, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace moe

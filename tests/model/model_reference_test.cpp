// The whole model against the PyTorch reference (python/reference/, float64): logits, the three
// losses, every parameter gradient, and the losses and parameters after 3 AdamW steps, for two
// configs that together cover every architecture option. Fixtures are written by
//   /usr/bin/python3 python/reference/make_fixture.py tests/fixtures/<cfg>.toml tests/fixtures/<cfg>.safetensors
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "moe/ckpt/safetensors.h"
#include "moe/core/arena.h"
#include "moe/model/transformer.h"
#include "moe/model/weights.h"
#include "moe/ops/elementwise.h"
#include "moe/optim/adamw.h"
#include "moe/parallel/local_dispatcher.h"
#include "moe/train/config.h"

namespace moe {
namespace {

// Stated tolerance: max |ours - ref| / max |ref| over a tensor (FP32 against float64).
constexpr double kRelTol = 1e-4;
// Parameters after 3 AdamW steps: Adam's 1/sqrt(v) amplifies FP32 rounding of near-zero
// gradients, so the per-tensor tolerance is looser there.
constexpr double kFinalParamRelTol = 1e-3;

std::vector<float> load_f32(const SafetensorsReader& f, const std::string& name) {
  const SafetensorsEntry& e = f.entry(name);
  EXPECT_EQ(e.dtype, DType::F32) << name;
  std::vector<float> out((e.end - e.begin) / 4);
  std::memcpy(out.data(), f.data(name), e.end - e.begin);
  return out;
}

double rel_error(const float* ours, const std::vector<float>& ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(ours[i]) - ref[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
  return diff / std::max(scale, 1e-30);
}

class ModelReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelReference, LogitsLossesGradientsAndAdamStepsMatchPyTorch) {
  const std::string fixture = std::string(MOE_SOURCE_DIR) + "/tests/fixtures/" + GetParam() + ".safetensors";
  SafetensorsReader f(fixture);
  const Config cfg = parse_config(f.metadata().at("config"), fixture);
  const ModelConfig& mc = cfg.model;
  const int64_t B = cfg.train.micro_batch_size, T = cfg.train.seq_len, R = B * T;

  ParamRegistry reg = build_registry(mc, 0, mc.num_experts);
  Arena state("state"), acts("activations");
  auto params_slot = state.reserve("params", DType::F32, {reg.total_numel()});
  auto grads_slot = state.reserve("grads", DType::F32, {reg.total_numel()});
  auto tokens_slot = state.reserve("tokens", DType::I32, {R});
  auto targets_slot = state.reserve("targets", DType::I32, {R});
  auto logits_slot = state.reserve("logits", DType::F32, {R, mc.vocab_size});
  AdamW adam(reg, state);
  LocalDispatcher dispatcher(mc.num_experts, mc.capacity_factor, /*dropless=*/true);
  Transformer model(mc, B, T, acts, dispatcher);
  state.commit();
  acts.commit();
  Tensor params = state.get(params_slot), grads = state.get(grads_slot);
  for (int i = 0; i < static_cast<int>(reg.entries().size()); ++i) {
    const std::vector<float> p = load_f32(f, "param." + reg.entry(i).name);
    ASSERT_EQ(static_cast<int64_t>(p.size()), reg.entry(i).numel()) << reg.entry(i).name;
    std::memcpy(reg.view(params, i).data, p.data(), p.size() * 4);
  }
  std::memcpy(state.get(tokens_slot).data, f.data("tokens"), R * 4);
  std::memcpy(state.get(targets_slot).data, f.data("targets"), R * 4);
  const ModelWeights w = bind_weights(mc, reg, params), g = bind_weights(mc, reg, grads);
  const RoutingState rs{};
  Tensor tokens = state.get(tokens_slot), targets = state.get(targets_slot);

  model.forward_logits(w, tokens, state.get(logits_slot), 0, rs);
  EXPECT_LE(rel_error(state.get(logits_slot).f32(), load_f32(f, "logits")), kRelTol) << "logits";

  const int64_t moe_layers = mc.num_hidden_layers - mc.first_k_dense_replace;
  StepScales scales{1.0f / static_cast<float>(R), 1.0f / static_cast<float>(moe_layers)};
  auto loss_of = [&](const MicrobatchLosses& l) {
    return l.lm_loss_sum / static_cast<double>(R) + mc.router_aux_loss_coef * l.lb_loss +
           mc.router_z_loss_coef * l.z_loss;
  };
  fill_zero(grads);
  model.forward_backward(w, g, tokens, targets, scales, 0, rs);
  const MicrobatchLosses l = model.losses();
  EXPECT_NEAR(l.lm_loss_sum / R, load_f32(f, "lm_loss")[0], kRelTol * load_f32(f, "lm_loss")[0]);
  EXPECT_NEAR(l.lb_loss, load_f32(f, "lb_loss")[0], kRelTol * load_f32(f, "lb_loss")[0]);
  EXPECT_NEAR(l.z_loss, load_f32(f, "z_loss")[0], kRelTol * load_f32(f, "z_loss")[0]);
  EXPECT_NEAR(loss_of(l), load_f32(f, "loss")[0], kRelTol * load_f32(f, "loss")[0]);
  for (int i = 0; i < static_cast<int>(reg.entries().size()); ++i) {
    const std::string& name = reg.entry(i).name;
    EXPECT_LE(rel_error(reg.view(grads, i).f32(), load_f32(f, "grad." + name)), kRelTol) << "gradient of " << name;
  }

  // Three AdamW steps on the same batch; the reference records the loss before each step and after the last.
  const std::vector<float> adam_losses = load_f32(f, "adam_losses");
  AdamWConfig oc;
  oc.lr = static_cast<float>(cfg.train.lr);
  oc.beta1 = static_cast<float>(cfg.train.beta1);
  oc.beta2 = static_cast<float>(cfg.train.beta2);
  oc.eps = static_cast<float>(cfg.train.eps);
  oc.weight_decay = static_cast<float>(cfg.train.weight_decay);
  double loss = loss_of(l);
  for (int step = 1; step <= 3; ++step) {
    EXPECT_NEAR(loss, adam_losses[step - 1], kRelTol * adam_losses[step - 1]) << "loss before AdamW step " << step;
    adam.step(params, grads, oc, static_cast<float>(cfg.train.grad_clip), step);
    fill_zero(grads);
    model.forward_backward(w, g, tokens, targets, scales, 0, rs);
    loss = loss_of(model.losses());
  }
  EXPECT_NEAR(loss, adam_losses[3], kRelTol * adam_losses[3]) << "loss after 3 AdamW steps";
  for (int i = 0; i < static_cast<int>(reg.entries().size()); ++i) {
    const std::string& name = reg.entry(i).name;
    EXPECT_LE(rel_error(reg.view(params, i).f32(), load_f32(f, "final." + name)), kFinalParamRelTol)
        << "parameter after 3 steps: " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelReference, ::testing::Values("ref_tiny", "ref_variants"));

}  // namespace
}  // namespace moe

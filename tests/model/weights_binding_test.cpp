// bind_weights over flat buffers of either dtype: the fused gate/up views of dense MLPs and shared
// experts are built from two adjacent projections in the buffer's own dtype (the GPU binds its BF16
// compute copy this way; with a 4-byte stride assumed, BF16 pairs were refused as non-adjacent).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "moe/core/error.h"
#include "moe/model/weights.h"

namespace moe {
namespace {

ModelConfig dense_and_shared() {
  ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.intermediate_size = 8;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.first_k_dense_replace = 1;  // layer 0 dense
  c.dense_intermediate_size = 24;
  c.shared_expert_intermediate_size = 12;
  return c;
}

TEST(WeightsBinding, fused_gate_up_views_keep_the_buffers_dtype) {
  const ModelConfig cfg = dense_and_shared();
  const ParamRegistry reg = build_registry(cfg, 0, cfg.num_experts);
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<uint8_t> flat(static_cast<size_t>(reg.total_numel()) * dtype_size(dtype));
    const Tensor t(flat.data(), dtype, {reg.total_numel()});
    const ModelWeights w = bind_weights(cfg, reg, t);
    const LayerWeights& dense = w.layers[0];
    const LayerWeights& moe = w.layers[1];
    EXPECT_EQ(dense.mlp_gate_up.dtype, dtype);
    EXPECT_EQ(dense.mlp_gate_up.shape, Shape({2 * 24, 16}));
    EXPECT_EQ(dense.mlp_gate_up.data, reg.view(t, reg.index("model.layers.0.mlp.gate_proj.weight")).data);
    EXPECT_EQ(moe.shared_gate_up.dtype, dtype);
    EXPECT_EQ(moe.shared_gate_up.shape, Shape({2 * 12, 16}));
    EXPECT_EQ(moe.shared_gate_up.data,
              reg.view(t, reg.index("model.layers.1.mlp.shared_expert.gate_proj.weight")).data);
  }
}

}  // namespace
}  // namespace moe

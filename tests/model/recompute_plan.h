// The activation plan under selective recompute, for tests: the bytes a Transformer (and the local
// dispatcher's expert buffers) reserve, planned without committing (no memory, no device), and the
// saving each mode must make, computed from the shapes.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "moe/core/arena.h"
#include "moe/model/transformer.h"
#include "moe/parallel/local_dispatcher.h"
#include "moe/train/config.h"

namespace moe::testing {

struct PlanBytes {
  size_t activations = 0;     // the model's buffers ("activations." in the arena)
  size_t expert_buffers = 0;  // the dispatcher's ("dispatch."; a GPU run keeps these in its symmetric heap)
  size_t total() const { return activations + expert_buffers; }
};

// Unpadded bytes, so differences are exact. `device` picks the plan's dtypes (BF16 activations on
// CUDA); a CUDA arena that is never committed needs no GPU.
inline PlanBytes planned_bytes(const Config& cfg, Recompute r, Device device, int lease_slots) {
  const ModelConfig& mc = cfg.model;
  Arena acts("activations", device);
  LocalDispatcher dispatcher(mc.num_experts, mc.capacity_factor, mc.dropless);
  Transformer model(mc, cfg.train.micro_batch_size, cfg.train.seq_len, acts, dispatcher, lease_slots, r);
  EXPECT_FALSE(acts.committed());
  EXPECT_EQ(acts.bytes_with_prefix(""), acts.bytes_with_prefix("activations.") + acts.bytes_with_prefix("dispatch."));
  return {acts.bytes_with_prefix("activations."), acts.bytes_with_prefix("dispatch.")};
}

// What each mode drops: every dropped buffer of every layer that has it, less the one shared copy
// that remains. x: bytes of an activation element (4 on the CPU, 2 on the GPU); statistics, router
// tensors and indices are 4-byte.
struct Dropped {
  int64_t attention = 0, experts = 0, block = 0;
};

inline Dropped expected_savings(const Config& cfg, int lease_slots, int64_t x) {
  const ModelConfig& m = cfg.model;
  const int64_t B = cfg.train.micro_batch_size, T = cfg.train.seq_len, R = B * T, D = m.hidden_size;
  const int64_t Hq = m.num_attention_heads, Hkv = m.num_key_value_heads, hd = m.head_dim();
  const int64_t Qo = Hq * hd, KVo = Hkv * hd, N = m.num_experts, K = m.num_experts_per_tok;
  const int64_t H = m.intermediate_size, S = m.shared_expert_intermediate_size, Hd = m.dense_intermediate_size;
  const int64_t L = m.num_hidden_layers, dense = m.first_k_dense_replace, moe = L - dense;
  const int64_t cap = rank_capacity(R, K, 1, m.capacity_factor, m.dropless);
  constexpr int64_t f = 4;
  // One layer's attention internals: input-norm output and rstd, q/k projections, v, attention
  // output, softmax statistics, and with qk-norm the normed q/k and their rstds.
  int64_t attention = (R * D + R * Qo + R * KVo + R * KVo + R * Qo) * x + (R + B * Hq * T) * f;
  if (m.qk_norm == QkNorm::Full) attention += (R * Qo + R * KVo) * x + 2 * R * f;
  if (m.qk_norm == QkNorm::PerHead) attention += (R * Qo + R * KVo) * x + (R * Hq + R * Hkv) * f;
  const int64_t experts = (cap * 2 * H + cap * H + R * 2 * S + R * S) * x;  // routed, then shared expert
  Dropped d;
  d.attention = (L - 1) * attention;
  d.experts = (moe - 1) * experts;
  // Block: also h_mid, the FFN norm output and rstd, router logits and scores, the dense MLPs; the
  // dispatcher's lease pools become one shared pair; the re-run router writes its choice into a
  // scratch [R, K] pair.
  d.block = d.attention + d.experts + (L - 1) * (2 * R * D * x + R * f) + (moe - 1) * 2 * R * N * f +
            (dense > 0 ? (dense - 1) * (R * 2 * Hd + R * Hd) * x : 0) + (moe * lease_slots - 1) * 2 * cap * D * x -
            2 * R * K * f;
  return d;
}

// experts < none, attention < none, block < attention, each by exactly its dropped buffers.
inline void expect_plan_shrinks_exactly(const Config& cfg, Device device, int lease_slots) {
  const PlanBytes none = planned_bytes(cfg, Recompute::None, device, lease_slots);
  const PlanBytes experts = planned_bytes(cfg, Recompute::Experts, device, lease_slots);
  const PlanBytes attention = planned_bytes(cfg, Recompute::Attention, device, lease_slots);
  const PlanBytes block = planned_bytes(cfg, Recompute::Block, device, lease_slots);
  std::printf("  activation plan (%s on %s, lease_slots %d), bytes: none %zu, experts %zu, attention %zu, block %zu\n",
              cfg.name.c_str(), std::string(device_name(device)).c_str(), lease_slots, none.total(), experts.total(), attention.total(),
              block.total());
  EXPECT_LT(experts.total(), none.total());
  EXPECT_LT(attention.total(), none.total());
  EXPECT_LT(block.total(), attention.total());
  const int64_t x = device == Device::CUDA ? 2 : 4;
  const Dropped d = expected_savings(cfg, lease_slots, x);
  EXPECT_EQ(static_cast<int64_t>(none.total() - experts.total()), d.experts);
  EXPECT_EQ(static_cast<int64_t>(none.total() - attention.total()), d.attention);
  EXPECT_EQ(static_cast<int64_t>(none.total() - block.total()), d.block);
}

}  // namespace moe::testing

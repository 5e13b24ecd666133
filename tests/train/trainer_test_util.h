// Shared helpers for tests that drive a Trainer: quiet bench options and one step's reduced gradient.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "moe/train/trainer.h"

namespace moe::testing {

// A tiny CPU MoE run (d 32, 8 experts, top-2, seq 16) of `steps` steps with 2 microbatches per rank
// of a `world`-rank job, no evaluation and no final checkpoint: the multi-rank equivalence tests'
// config, before the keys each test varies.
inline std::vector<std::string> tiny_moe_cpu_run(int world, int steps) {
  return {"run.device=\"cpu\"",
          "model.hidden_size=32",
          "model.intermediate_size=16",
          "model.num_experts=8",
          "model.num_experts_per_tok=2",
          "train.seq_len=16",
          "train.micro_batch_size=1",
          "train.global_batch_size=" + std::to_string(2 * world),
          "train.warmup_steps=1",
          "train.steps=" + std::to_string(steps),
          "train.eval_every=0",
          "train.eval_batches=0",
          "run.save_final=false",
          "data.synthetic_tokens=20000",
          "data.synthetic_eval_tokens=2000"};
}

// Nothing written to disk, nothing printed.
inline TrainOptions quiet_bench() {
  TrainOptions opts;
  opts.bench = true;
  opts.quiet = true;
  return opts;
}

// name -> the reduced gradient of optimizer step `step`'s accumulation (host copy). Elements this
// rank does not hold (other ranks' expert slices on multi-rank runs) read `missing` (NaN there).
using Gradients = std::map<std::string, std::vector<float>>;

inline Gradients step_gradients(Trainer& t, int64_t step, float missing = 0.0f) {
  Gradients out;
  t.accumulate_gradients(step);
  t.store().reduced_gradients([&](const std::string& name, int64_t begin, int64_t end, const float* data) {
    std::vector<float>& g = out[name];
    if (g.size() < static_cast<size_t>(end)) g.resize(static_cast<size_t>(end), missing);
    std::copy(data, data + (end - begin), g.begin() + begin);
  });
  return out;
}

}  // namespace moe::testing

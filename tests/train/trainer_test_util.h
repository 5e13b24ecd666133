// Shared helpers for tests that drive a Trainer: quiet bench options and one step's reduced gradient.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "moe/train/trainer.h"

namespace moe::testing {

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

// Auxiliary-loss-free load balancing (model.bias_update_rate > 0): a per-expert bias added to
// the router scores for expert selection only (never to the combine weights), nudged after
// every optimizer step against the expert's load in that step.
#pragma once

#include <vector>

#include "moe/model/config.h"

namespace moe {

// bias and load are [layers x num_experts]; load holds the global routes per expert of the step
// (all ranks). Sign update: experts below their layer's mean load gain `bias_update_rate`,
// those above lose it. No-op for dense layers, for non-learned routing and when the rate is 0.
void update_router_bias(std::vector<float>& bias, const std::vector<float>& load, const ModelConfig& cfg);

}  // namespace moe

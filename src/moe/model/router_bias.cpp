#include "moe/model/router_bias.h"

#include "moe/core/error.h"

namespace moe {

void update_router_bias(std::vector<float>& bias, const std::vector<float>& load, const ModelConfig& cfg) {
  const double rate = cfg.bias_update_rate;
  if (rate <= 0 || cfg.routing != Routing::Learned) return;
  const int64_t N = cfg.num_experts, L = cfg.num_hidden_layers;
  MOE_CHECK(static_cast<int64_t>(bias.size()) == L * N && static_cast<int64_t>(load.size()) == L * N,
            "update_router_bias: bias and load must hold layers x experts = ", L * N, " values");
  for (int64_t l = 0; l < L; ++l) {
    if (!cfg.is_moe_layer(l)) continue;
    float* b = bias.data() + l * N;
    const float* c = load.data() + l * N;
    double mean = 0;
    for (int64_t e = 0; e < N; ++e) mean += c[e];
    mean /= static_cast<double>(N);
    for (int64_t e = 0; e < N; ++e) b[e] += static_cast<float>(rate * (c[e] < mean ? 1.0 : c[e] > mean ? -1.0 : 0.0));
  }
}

}  // namespace moe

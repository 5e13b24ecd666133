#include "moe/train/pipeline_layout.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "moe/core/error.h"

namespace moe {

std::vector<int> PipelineLayout::chunks_of(int stage) const {
  std::vector<int> out;
  for (int v = 0; v < virtual_stages; ++v) out.push_back(v * stages + stage);
  return out;
}

std::string PipelineLayout::describe() const {
  std::ostringstream os;
  for (int c = 0; c < chunks(); ++c) {
    if (c > 0) os << (c % stages == 0 ? " | " : "+");
    os << end_layer(c) - first_layer(c);
  }
  return os.str();
}

double layer_cost(const ModelConfig& cfg, int64_t seq_len, int64_t l) {
  const double D = static_cast<double>(cfg.hidden_size), hd = static_cast<double>(cfg.head_dim());
  const double Q = static_cast<double>(cfg.num_attention_heads) * hd, KV = static_cast<double>(cfg.num_key_value_heads) * hd;
  // Projections, and the causal scores and weighted sum (half of the T x T square, twice).
  double flops = 2 * D * (2 * Q + 2 * KV) + 2 * static_cast<double>(seq_len) * Q;
  if (cfg.is_moe_layer(l)) {
    const double N = static_cast<double>(cfg.num_experts), K = static_cast<double>(cfg.num_experts_per_tok);
    flops += 2 * D * N + K * 6 * D * static_cast<double>(cfg.intermediate_size) +
             6 * D * static_cast<double>(cfg.shared_expert_intermediate_size);
  } else {
    flops += 6 * D * static_cast<double>(cfg.dense_intermediate_size);
  }
  return flops;
}

double embedding_cost(const ModelConfig& cfg) { return static_cast<double>(cfg.hidden_size); }

double head_cost(const ModelConfig& cfg) {
  return 2 * static_cast<double>(cfg.vocab_size) * static_cast<double>(cfg.hidden_size);
}

namespace {

// Contiguous split of the layers into `chunks` non-empty runs minimizing the costliest run
// (dynamic programming over split points; models have at most thousands of layers).
std::vector<int64_t> balanced_boundaries(const std::vector<double>& cost, double first_extra, double last_extra,
                                         int chunks) {
  const int64_t L = static_cast<int64_t>(cost.size());
  std::vector<double> prefix(L + 1, 0.0);
  for (int64_t l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + cost[l];
  const double inf = std::numeric_limits<double>::infinity();
  // best[c][l]: the lowest maximum over chunks 0..c-1 holding layers [0, l); cut[c][l]: where chunk c-1 begins.
  std::vector<std::vector<double>> best(chunks + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int64_t>> cut(chunks + 1, std::vector<int64_t>(L + 1, 0));
  best[0][0] = 0;
  for (int c = 1; c <= chunks; ++c)
    for (int64_t l = c; l <= L - (chunks - c); ++l)
      for (int64_t b = c - 1; b < l; ++b) {
        if (best[c - 1][b] == inf) continue;
        double run = prefix[l] - prefix[b];
        if (c == 1) run += first_extra;
        if (c == chunks) run += last_extra;
        const double worst = std::max(best[c - 1][b], run);
        if (worst < best[c][l]) best[c][l] = worst, cut[c][l] = b;
      }
  std::vector<int64_t> bounds(chunks + 1, L);
  for (int c = chunks; c >= 1; --c) bounds[c - 1] = cut[c][bounds[c]];
  return bounds;
}

std::string sizes_text(const std::vector<int64_t>& sizes) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < sizes.size(); ++i) os << (i ? ", " : "") << sizes[i];
  os << "]";
  return os.str();
}

std::string divisors_up_to(int64_t n) {
  std::ostringstream os;
  for (int64_t d = 1; d <= n; ++d) os << (d == 1 ? "" : ", ") << d;
  return os.str();
}

}  // namespace

PipelineLayout plan_pipeline_layout(const ModelConfig& cfg, int64_t seq_len, int stages, int virtual_stages,
                                    const std::vector<int64_t>& layers_per_chunk) {
  const int64_t L = cfg.num_hidden_layers;
  MOE_CHECK(stages >= 1 && virtual_stages >= 1, "parallel.pp = ", stages, " and parallel.pp_virtual = ",
            virtual_stages, " must be at least 1");
  const int C = stages * virtual_stages;
  MOE_CHECK(C <= L, "parallel.pp = ", stages, " x parallel.pp_virtual = ", virtual_stages, " = ", C,
            " pipeline chunks need at least one layer each, but model.num_hidden_layers = ", L,
            "; use pp x pp_virtual in ", divisors_up_to(L));
  PipelineLayout out;
  out.stages = stages;
  out.virtual_stages = virtual_stages;
  const auto balanced = [&] {
    std::vector<double> cost;
    for (int64_t l = 0; l < L; ++l) cost.push_back(layer_cost(cfg, seq_len, l));
    return balanced_boundaries(cost, embedding_cost(cfg), head_cost(cfg), C);
  };
  if (layers_per_chunk.empty()) {
    out.chunk_begin = balanced();
    return out;
  }
  int64_t sum = 0;
  bool positive = true;
  for (int64_t n : layers_per_chunk) sum += n, positive = positive && n >= 1;
  if (static_cast<int>(layers_per_chunk.size()) != C || sum != L || !positive) {
    // The balanced split as an example of sizes that work.
    const std::vector<int64_t> bounds = balanced();
    std::vector<int64_t> example;
    for (int c = 0; c < C; ++c) example.push_back(bounds[c + 1] - bounds[c]);
    MOE_FAIL("parallel.pp_layers = ", sizes_text(layers_per_chunk), " gives ", layers_per_chunk.size(),
             " chunk sizes adding up to ", sum, "; it needs parallel.pp x parallel.pp_virtual = ", C,
             " sizes of at least 1 adding up to model.num_hidden_layers = ", L, ", e.g. parallel.pp_layers = ",
             sizes_text(example), " (the balanced split, also what an empty array gives)");
  }
  out.chunk_begin.push_back(0);
  for (int64_t n : layers_per_chunk) out.chunk_begin.push_back(out.chunk_begin.back() + n);
  return out;
}

}  // namespace moe

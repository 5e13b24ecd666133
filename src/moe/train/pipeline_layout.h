// Which layers each pipeline stage holds. The L layers form C = pp x pp_virtual contiguous model
// chunks (chunk c on rank c % pp, parallel/pipeline_schedule.h); chunk 0 also holds the embedding,
// chunk C - 1 the final norm and LM head. Boundaries are given (parallel.pp_layers: layers per
// chunk) or balanced: the split that minimizes the costliest chunk, a layer's cost being its
// forward FLOPs per token (attention with its scores, router, K routed experts, shared expert or
// dense MLP) and the embedding and LM head counted with their chunks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/model/config.h"
#include "moe/parallel/pipeline_schedule.h"

namespace moe {

struct PipelineLayout {
  int stages = 1, virtual_stages = 1;
  std::vector<int64_t> chunk_begin;  // C + 1 boundaries: chunk c holds layers [chunk_begin[c], chunk_begin[c + 1])
  int chunks() const { return stages * virtual_stages; }
  int64_t first_layer(int chunk) const { return chunk_begin[chunk]; }
  int64_t end_layer(int chunk) const { return chunk_begin[chunk + 1]; }
  int rank_of(int chunk) const { return chunk % stages; }
  // The chunks of pipeline rank `stage`, in order (its virtual stages).
  std::vector<int> chunks_of(int stage) const;
  // "2+2 | 1+3": layers per chunk, for the start-up printout.
  std::string describe() const;
};

// Forward FLOPs per token of layer l, of the embedding and of the final norm + LM head.
double layer_cost(const ModelConfig& cfg, int64_t seq_len, int64_t layer);
double embedding_cost(const ModelConfig& cfg);
double head_cost(const ModelConfig& cfg);

// The layout of `stages` x `virtual_stages` chunks; `layers_per_chunk` empty = balanced by cost.
// Throws naming the keys and the values that would work when the layout is impossible (more
// chunks than layers, given sizes that do not add up to model.num_hidden_layers...).
PipelineLayout plan_pipeline_layout(const ModelConfig& cfg, int64_t seq_len, int stages, int virtual_stages,
                                    const std::vector<int64_t>& layers_per_chunk = {});

}  // namespace moe

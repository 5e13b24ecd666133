// Parameter registry: every trainable tensor under its Hugging Face OLMoE name, with its
// logical (global) shape, the rows of dim 0 this rank holds (experts: the EP slice), its
// replica group and its place in the flat FP32 buffers. Parameters, gradients and both AdamW
// moments share one layout, so the optimizer and the gradient norm run over flat ranges.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "moe/core/tensor.h"

namespace moe {

// Which ranks hold a replica of a parameter (and so reduce its gradient together):
// dense parameters are replicated over the data-parallel group, expert parameters over the
// ranks that hold the same expert slice (ep_dp).
enum class ReplicaGroup { Dense, Expert };

struct ParamEntry {
  std::string name;           // Hugging Face name, e.g. model.layers.3.mlp.experts.gate_up_proj
  Shape global_shape;         // the logical tensor
  Shape local_shape;          // what this rank holds: dim 0 restricted to [row_begin, row_end)
  int64_t row_begin = 0;      // first logical dim-0 row held here
  int64_t offset = 0;         // element offset in the flat buffers
  ReplicaGroup group = ReplicaGroup::Dense;
  bool decay = true;          // weight decay applies (matrices), not to norm weights

  int64_t numel() const { return local_shape.numel(); }
  // Flat element range [begin, end) of the logical row-major tensor that this rank holds.
  int64_t global_begin() const { return local_shape.ndim == 0 ? 0 : row_begin * (numel() / local_shape[0]); }
};

class ParamRegistry {
 public:
  // Registers a parameter held whole on this rank. Returns its index.
  int add(const std::string& name, Shape shape, ReplicaGroup group, bool decay);
  // Registers a parameter of which this rank holds dim-0 rows [row_begin, row_begin + local_rows).
  int add_sliced(const std::string& name, Shape global_shape, int64_t row_begin, int64_t local_rows,
                 ReplicaGroup group, bool decay);

  const std::vector<ParamEntry>& entries() const { return entries_; }
  const ParamEntry& entry(int i) const { return entries_.at(i); }
  // Index by name; throws naming the parameter when absent.
  int index(const std::string& name) const;
  bool has(const std::string& name) const { return by_name_.count(name) != 0; }
  int64_t total_numel() const { return total_; }
  // The flat buffers are [dense region | expert region]: element ranges of each replica group.
  // Throws if parameters of the two groups are interleaved.
  std::pair<int64_t, int64_t> region(ReplicaGroup group) const;
  int64_t global_numel() const;  // sum of logical sizes

  // The view of parameter i inside a flat buffer laid out by this registry (FP32 main weights,
  // gradients, or the BF16 compute copy: the view takes the buffer's dtype).
  Tensor view(const Tensor& flat, int i) const;
  // Parameters i..j-1 registered back to back, viewed as one tensor with shape `shape`
  // (e.g. gate_proj then up_proj as one fused [2S, D] matrix).
  Tensor view_span(const Tensor& flat, int first, int last_inclusive, Shape shape) const;

 private:
  std::vector<ParamEntry> entries_;
  std::unordered_map<std::string, int> by_name_;
  int64_t total_ = 0;
};

}  // namespace moe

#include "moe/model/params.h"

namespace moe {

int ParamRegistry::add(const std::string& name, Shape shape, ReplicaGroup group, bool decay) {
  return add_sliced(name, shape, 0, shape[0], group, decay);
}

int ParamRegistry::add_sliced(const std::string& name, Shape global_shape, int64_t row_begin, int64_t local_rows,
                              ReplicaGroup group, bool decay) {
  MOE_CHECK(!has(name), "parameter '", name, "' registered twice");
  MOE_CHECK(global_shape.ndim >= 1 && row_begin >= 0 && row_begin + local_rows <= global_shape[0],
            "parameter '", name, "': rows [", row_begin, ", ", row_begin + local_rows, ") outside ",
            global_shape.str());
  ParamEntry e;
  e.name = name;
  e.global_shape = global_shape;
  e.local_shape = global_shape;
  e.local_shape.dims[0] = local_rows;
  e.row_begin = row_begin;
  e.offset = total_;
  e.group = group;
  e.decay = decay;
  total_ += e.numel();
  by_name_[name] = static_cast<int>(entries_.size());
  entries_.push_back(e);
  return static_cast<int>(entries_.size()) - 1;
}

int ParamRegistry::index(const std::string& name) const {
  auto it = by_name_.find(name);
  MOE_CHECK(it != by_name_.end(), "no parameter named '", name, "'");
  return it->second;
}

std::pair<int64_t, int64_t> ParamRegistry::region(ReplicaGroup group) const {
  int64_t begin = -1, end = -1;
  for (const auto& e : entries_) {
    if (e.group != group) continue;
    if (begin < 0) begin = e.offset;
    MOE_CHECK(end < 0 || e.offset == end, "parameters of one replica group are not contiguous at '", e.name, "'");
    end = e.offset + e.numel();
  }
  if (begin < 0) return {total_, total_};  // empty region at the end
  return {begin, end};
}

int64_t ParamRegistry::global_numel() const {
  int64_t n = 0;
  for (const auto& e : entries_) n += e.global_shape.numel();
  return n;
}

Tensor ParamRegistry::view(const Tensor& flat, int i) const {
  const ParamEntry& e = entry(i);
  MOE_CHECK(flat.numel() == total_, "flat buffer has ", flat.numel(), " elements, registry needs ", total_);
  return Tensor(static_cast<char*>(flat.data) + e.offset * static_cast<int64_t>(dtype_size(flat.dtype)), flat.dtype,
                e.local_shape, flat.device);
}

Tensor ParamRegistry::view_span(const Tensor& flat, int first, int last_inclusive, Shape shape) const {
  int64_t n = 0;
  for (int i = first; i <= last_inclusive; ++i) {
    MOE_CHECK(i == first || entry(i).offset == entry(i - 1).offset + entry(i - 1).numel(),
              "parameters '", entry(first).name, "'..'", entry(last_inclusive).name, "' are not contiguous");
    n += entry(i).numel();
  }
  MOE_CHECK(shape.numel() == n, "fused view ", shape.str(), " does not cover ", n, " elements");
  return Tensor(static_cast<char*>(flat.data) + entry(first).offset * static_cast<int64_t>(dtype_size(flat.dtype)),
                flat.dtype, shape, flat.device);
}

}  // namespace moe

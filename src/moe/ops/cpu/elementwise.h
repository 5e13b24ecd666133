// CPU element-wise helpers. Semantics: moe/ops/elementwise.h; ops/elementwise.cpp checks the
// arguments.
#pragma once

#include <vector>

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/elementwise.h"

namespace moe::cpu {

void add_inplace(Tensor y, Tensor x, Stream stream);
void fill_zero(Tensor y, Stream stream);
void copy(Tensor dst, Tensor src, Stream stream);
void cast_copy(Tensor dst, Tensor src, Stream stream);
void accumulate_scalars(Tensor stats, const std::vector<ScalarTerm>& terms, Stream stream);

}  // namespace moe::cpu

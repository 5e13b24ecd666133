// CUDA element-wise helpers. Semantics: moe/ops/elementwise.h (same signatures); ops/elementwise.cpp
// checks the arguments.
//
// Dtypes: add_inplace: y and x share T, F32 or BF16, summed in FP32. fill_zero and copy: any dtype.
// cast_copy: F32 <-> BF16 (round to nearest even, bit-identical to moe::f32_to_bf16), or a plain
// copy when the dtypes match. accumulate_scalars: stats F32, each src F32 or I32.
// All tensors live on the CUDA device; ops run on `stream`, allocate nothing, never synchronize.
#pragma once

#include <vector>

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/elementwise.h"

namespace moe::cuda {

void add_inplace(Tensor y, Tensor x, Stream stream = {});
void fill_zero(Tensor y, Stream stream = {});
void copy(Tensor dst, Tensor src, Stream stream = {});
void cast_copy(Tensor dst, Tensor src, Stream stream = {});
// NOTES: the terms travel by value in the kernel's parameters (up to 64 per launch; more take
// several launches on the stream, in order), so a call allocates nothing, copies nothing from the
// host and can be captured in a CUDA graph.
void accumulate_scalars(Tensor stats, const std::vector<ScalarTerm>& terms, Stream stream = {});

}  // namespace moe::cuda

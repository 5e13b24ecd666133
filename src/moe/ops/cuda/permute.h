// CUDA row movement and weighted combine: the GPU implementation of moe/ops/permute.h (same
// signatures, same meaning as moe::cpu).
//
// Dtype contract (checked by ops/permute.cpp): the row tensors of one call (scatter_rows_to_routes:
// src, dst; its backward: ddst, dsrc; combine_rows: y, out; combine_rows_backward: dout, y, dy)
// share one dtype T, F32 or BF16 (__nv_bfloat16). weights and dweights are F32 [T, K]; route_index
// is I32 [T*K]. Sums (over k, and the dot products of dweights) accumulate in FP32, over k in
// ascending order, and round once on store. Each op only enqueues kernels on `stream`: no
// allocation, no host copy, no synchronization.
// Checks that need device data are not made on the host: route_index entries outside [-1, rows)
// are treated as dropped routes (the CPU rejects them), and route_index is trusted to be injective
// where rows are written (scatter_rows_to_routes, combine_rows_backward; the CPU verifies it).
// Deterministic: each output element is written by one thread; every sum runs in a fixed order.
#pragma once

#include "moe/ops/permute.h"

namespace moe::cuda {

void scatter_rows_to_routes(Tensor dst, Tensor src, Tensor route_index, int top_k, Stream stream = {});
void scatter_rows_to_routes_fp8(Fp8Tensor dst, Tensor src, Tensor route_index, int top_k, Stream stream = {});
void scatter_rows_to_routes_backward(Tensor dsrc, Tensor ddst, Tensor route_index, int top_k, bool accumulate,
                                     Stream stream = {});
void combine_rows(Tensor out, Tensor y, Tensor weights, Tensor route_index, int top_k, bool accumulate,
                  Stream stream = {});
void combine_rows_backward(Tensor dy, Tensor dweights, Tensor dout, Tensor y, Tensor weights, Tensor route_index,
                           int top_k, Stream stream = {});
void combine_rows_weight_grad(Tensor dweights, Tensor dout, Tensor y, Tensor route_index, int top_k,
                              Stream stream = {});
void invert_route_index(Tensor route_of_row, Tensor route_index, Stream stream = {});

}  // namespace moe::cuda

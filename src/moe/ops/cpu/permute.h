// CPU row movement and weighted combine: the reference meaning of ops/permute.h (same signatures;
// ops/permute.cpp checks the arguments, route_index entries included).
#pragma once

#include "moe/ops/permute.h"

namespace moe::cpu {

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

}  // namespace moe::cpu

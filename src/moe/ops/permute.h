// Row movement between token order and the expert-major buffer, and the weighted combine.
// Pure data movement is exact; the combine sums in FP32 in fixed k order (deterministic).
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/fp8.h"

namespace moe {

// Scatters each token's row to the rows of its routes in the expert-major buffer:
// dst[route_index[t*K+k]] = src[t] for every kept route (dropped routes, -1, write nothing; rows no
// route names are untouched). src [T, D], dst [rows, D], route_index [T*K] (injective on kept routes).
void scatter_rows_to_routes(Tensor dst, Tensor src, Tensor route_index, int top_k, Stream stream = {});
// scatter_rows_to_routes with each token row quantized once on its way (the FP8 dispatch, ep.payload
// = "fp8"): every kept route's row of dst (Rows tiles: codes [rows, D] E4M3, scales [rows,
// ceil(D / 128)] F32) gets the codes and scales fp8_quantize_rows writes for src[t], bit for bit.
// src [T, D] in the device's compute dtype (F32; BF16 or F32 on the GPU).
void scatter_rows_to_routes_fp8(Fp8Tensor dst, Tensor src, Tensor route_index, int top_k, Stream stream = {});
// Gradient of scatter_rows_to_routes (a gather): dsrc[t] (= or +=, per accumulate) sum over kept k, in
// k order, of ddst[route_index[t*K+k]].
void scatter_rows_to_routes_backward(Tensor dsrc, Tensor ddst, Tensor route_index, int top_k, bool accumulate,
                                     Stream stream = {});

// out[t] (= or +=, per accumulate) sum_k weights[t,k] * y[route_index[t*K+k]] over kept routes, FP32, k ascending.
// y [rows, D], weights [T, K], out [T, D].
void combine_rows(Tensor out, Tensor y, Tensor weights, Tensor route_index, int top_k, bool accumulate,
                  Stream stream = {});
// Gradient of combine_rows: dy[route_index[t*K+k]] = weights[t,k] * dout[t] (rows of dropped routes are
// untouched); dweights[t,k] = dot(dout[t], y[row]) for kept routes and 0 for dropped ones.
void combine_rows_backward(Tensor dy, Tensor dweights, Tensor dout, Tensor y, Tensor weights, Tensor route_index,
                           int top_k, Stream stream = {});
// dweights of combine_rows_backward alone, for a caller that never stores dy (it quantizes
// weights[t,k] * dout[t] straight into FP8 operands: moe/ops/fp8_gather.h). The same bits.
void combine_rows_weight_grad(Tensor dweights, Tensor dout, Tensor y, Tensor route_index, int top_k,
                              Stream stream = {});

// The inverse of an injective route_index: route_of_row[route_index[i]] = i for every kept route i,
// -1 for every row no route names. route_of_row I32 [rows].
void invert_route_index(Tensor route_of_row, Tensor route_index, Stream stream = {});

}  // namespace moe

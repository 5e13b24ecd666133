// CPU row movement over a local buffer: the loops of route_rows.h with route i's row at
// route_index[i] (-1: dropped). Each loop that writes expert-buffer rows relies on route_index
// being injective (ops/permute.cpp checks it).
#include "moe/ops/cpu/permute.h"

#include <algorithm>
#include <cstdint>

#include "moe/ops/cpu/route_rows.h"

namespace moe::cpu {

namespace {

// Route i's row of `rows` (row_elems elements each), or nullptr for a dropped route.
template <typename Elem>
struct LocalRowOf {
  Elem* rows;
  size_t row_elems;
  const int32_t* route_index;
  Elem* operator()(int64_t i) const {
    const int32_t r = route_index[i];
    return r < 0 ? nullptr : rows + static_cast<size_t>(r) * row_elems;
  }
};

}  // namespace

// Pure data movement: any element type, copied bytewise.
void scatter_rows_to_routes(Tensor dst, Tensor src, Tensor route_index, int top_k, Stream /*stream*/) {
  const int64_t T = src.dim(0), D = src.dim(1);
  const size_t row_bytes = static_cast<size_t>(D) * dtype_size(src.dtype);
  route_rows::scatter_routes(src.data, row_bytes, T, top_k, D,
                             LocalRowOf<char>{static_cast<char*>(dst.data), row_bytes, route_index.i32()});
}

void scatter_rows_to_routes_fp8(Fp8Tensor dst, Tensor src, Tensor route_index, int top_k, Stream /*stream*/) {
  const int64_t D = src.dim(1), tiles = dst.scales.dim(1);
  route_rows::scatter_routes_fp8(
      src.f32(), src.dim(0), top_k, D,
      LocalRowOf<uint8_t>{dst.codes.ptr<uint8_t>(), static_cast<size_t>(D), route_index.i32()},
      LocalRowOf<float>{dst.scales.f32(), static_cast<size_t>(tiles), route_index.i32()});
}

void scatter_rows_to_routes_backward(Tensor dsrc, Tensor ddst, Tensor route_index, int top_k, bool accumulate,
                                     Stream /*stream*/) {
  const int64_t D = dsrc.dim(1);
  route_rows::sum_routes(dsrc.f32(), nullptr, dsrc.dim(0), top_k, D, accumulate,
                         LocalRowOf<const float>{ddst.f32(), static_cast<size_t>(D), route_index.i32()});
}

void combine_rows(Tensor out, Tensor y, Tensor weights, Tensor route_index, int top_k, bool accumulate,
                  Stream /*stream*/) {
  const int64_t D = out.dim(1);
  route_rows::sum_routes(out.f32(), weights.f32(), out.dim(0), top_k, D, accumulate,
                         LocalRowOf<const float>{y.f32(), static_cast<size_t>(D), route_index.i32()});
}

void combine_rows_backward(Tensor dy, Tensor dweights, Tensor dout, Tensor y, Tensor weights, Tensor route_index,
                           int top_k, Stream /*stream*/) {
  const int64_t D = dout.dim(1);
  route_rows::combine_backward_routes(dweights.f32(), dout.f32(), weights.f32(), dout.dim(0), top_k, D,
                                      LocalRowOf<const float>{y.f32(), static_cast<size_t>(D), route_index.i32()},
                                      LocalRowOf<float>{dy.f32(), static_cast<size_t>(D), route_index.i32()});
}

void combine_rows_weight_grad(Tensor dweights, Tensor dout, Tensor y, Tensor route_index, int top_k,
                              Stream /*stream*/) {
  const int64_t D = dout.dim(1);
  route_rows::combine_backward_routes(dweights.f32(), dout.f32(), /*weights=*/nullptr, dout.dim(0), top_k, D,
                                      LocalRowOf<const float>{y.f32(), static_cast<size_t>(D), route_index.i32()},
                                      [](int64_t) -> float* { return nullptr; });
}

void invert_route_index(Tensor route_of_row, Tensor route_index, Stream /*stream*/) {
  int32_t* routes = route_of_row.i32();
  const int32_t* index = route_index.i32();
  std::fill(routes, routes + route_of_row.numel(), -1);
  for (int64_t i = 0; i < route_index.numel(); ++i)
    if (index[i] >= 0) routes[index[i]] = static_cast<int32_t>(i);
}

}  // namespace moe::cpu

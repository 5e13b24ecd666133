#include "moe/ops/permute.h"

#include <cstdint>
#include <vector>

#include "moe/ops/cpu/permute.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/permute.h")
#include "moe/ops/cuda/permute.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

namespace {

// The call's first row tensor: 2-D, of a dtype this device computes in (the call's T).
void check_lead_rows(const OpCheck& check, const char* name, const Tensor& t) {
  check.compute_dtype(name, t);
  check.ndim(name, t, 2);
}

// Another 2-D row tensor, with the dtype of the first (ref).
void check_rows(const OpCheck& check, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
  check.same_dtype(name, t, ref_name, ref);
  check.ndim(name, t, 2);
}

void check_same_width(const OpCheck& check, const char* name, const Tensor& t, const char* ref_name,
                      const Tensor& ref) {
  MOE_CHECK(t.dim(1) == ref.dim(1), check.op(), ": ", name, " ", t.shape.str(), " and ", ref_name, " ",
            ref.shape.str(), " differ in row width");
}

// An F32 [T, top_k] tensor (the combine weights or their gradient).
void check_weights(const OpCheck& check, const char* name, const Tensor& t, int64_t T, int top_k) {
  check.tensor(name, t, DType::F32, 2);
  check.shape(name, t, {T, top_k});
}

// route_index I32 [T * top_k]. Where the host can read it, every entry is -1 (dropped) or a row in
// [0, rows), and with `injective` no row is used twice (the op writes those rows in parallel); the
// GPU treats other entries as dropped and trusts injectivity (see ops/cuda/permute.h).
void check_route_index(const OpCheck& check, const Tensor& route_index, int64_t T, int top_k, int64_t rows,
                       bool injective) {
  const char* op = check.op();
  check.tensor("route_index", route_index, DType::I32);
  MOE_CHECK(top_k >= 1, op, ": top_k = ", top_k, " must be at least 1");
  MOE_CHECK(route_index.numel() == T * top_k, op, ": route_index has shape ", route_index.shape.str(), ", expected [",
            T * top_k, "] (T = ", T, " times top_k = ", top_k, ")");
  if (!check.host_data()) return;
  check.values_in("route_index", route_index, -1, rows, "-1 for a dropped route, else a buffer row");
  if (!injective) return;
  const int32_t* index = route_index.i32();
  std::vector<uint8_t> used(static_cast<size_t>(rows), 0);
  for (int64_t i = 0; i < T * top_k; ++i) {
    const int32_t r = index[i];
    if (r < 0) continue;
    MOE_CHECK(!used[static_cast<size_t>(r)], op, ": route_index[", i, "] = ", r,
              " repeats a row already used by another route");
    used[static_cast<size_t>(r)] = 1;
  }
}

}  // namespace

void scatter_rows_to_routes(Tensor dst, Tensor src, Tensor route_index, int top_k, Stream stream) {
  const OpCheck check("scatter_rows_to_routes", src.device);
  // Pure data movement: the CPU copies any dtype bytewise; the GPU moves F32 or BF16 words.
  if (check.host_data())
    check.on_device("src", src);
  else
    check.compute_dtype("src", src);
  check.ndim("src", src, 2);
  check_rows(check, "dst", dst, "src", src);
  check_same_width(check, "dst", dst, "src", src);
  check_route_index(check, route_index, src.dim(0), top_k, dst.dim(0), /*injective=*/true);
  MOE_OP_DISPATCH(src.device, scatter_rows_to_routes, dst, src, route_index, top_k, stream);
}

void scatter_rows_to_routes_fp8(Fp8Tensor dst, Tensor src, Tensor route_index, int top_k, Stream stream) {
  const OpCheck check("scatter_rows_to_routes_fp8", src.device);
  check_lead_rows(check, "src", src);
  check.tensor("dst.codes", dst.codes, DType::FP8_E4M3, 2);
  check.tensor("dst.scales", dst.scales, DType::F32, 2);
  MOE_CHECK(dst.tiles == Fp8Tiles::Rows, check.op(), ": dst must have Rows (1 x 128) tiles");
  check_same_width(check, "dst.codes", dst.codes, "src", src);
  check.shape("dst.scales", dst.scales, fp8_scale_shape(dst.codes.shape, Fp8Tiles::Rows));
  check_route_index(check, route_index, src.dim(0), top_k, dst.codes.dim(0), /*injective=*/true);
  MOE_OP_DISPATCH(src.device, scatter_rows_to_routes_fp8, dst, src, route_index, top_k, stream);
}

void scatter_rows_to_routes_backward(Tensor dsrc, Tensor ddst, Tensor route_index, int top_k, bool accumulate,
                                     Stream stream) {
  const OpCheck check("scatter_rows_to_routes_backward", dsrc.device);
  check_lead_rows(check, "dsrc", dsrc);
  check_rows(check, "ddst", ddst, "dsrc", dsrc);
  check_same_width(check, "ddst", ddst, "dsrc", dsrc);
  check_route_index(check, route_index, dsrc.dim(0), top_k, ddst.dim(0), /*injective=*/false);
  MOE_OP_DISPATCH(dsrc.device, scatter_rows_to_routes_backward, dsrc, ddst, route_index, top_k, accumulate, stream);
}

void combine_rows(Tensor out, Tensor y, Tensor weights, Tensor route_index, int top_k, bool accumulate, Stream stream) {
  const OpCheck check("combine_rows", out.device);
  check_lead_rows(check, "out", out);
  check_rows(check, "y", y, "out", out);
  check_same_width(check, "y", y, "out", out);
  check_weights(check, "weights", weights, out.dim(0), top_k);
  check_route_index(check, route_index, out.dim(0), top_k, y.dim(0), /*injective=*/false);
  MOE_OP_DISPATCH(out.device, combine_rows, out, y, weights, route_index, top_k, accumulate, stream);
}

void combine_rows_backward(Tensor dy, Tensor dweights, Tensor dout, Tensor y, Tensor weights, Tensor route_index,
                           int top_k, Stream stream) {
  const OpCheck check("combine_rows_backward", dout.device);
  check_lead_rows(check, "dout", dout);
  check_rows(check, "y", y, "dout", dout);
  check_rows(check, "dy", dy, "dout", dout);
  check.same_shape("dy", dy, "y", y);
  check_same_width(check, "y", y, "dout", dout);
  const int64_t T = dout.dim(0);
  check_weights(check, "weights", weights, T, top_k);
  check_weights(check, "dweights", dweights, T, top_k);
  check_route_index(check, route_index, T, top_k, y.dim(0), /*injective=*/true);
  MOE_OP_DISPATCH(dout.device, combine_rows_backward, dy, dweights, dout, y, weights, route_index, top_k, stream);
}

void combine_rows_weight_grad(Tensor dweights, Tensor dout, Tensor y, Tensor route_index, int top_k, Stream stream) {
  const OpCheck check("combine_rows_weight_grad", dout.device);
  check_lead_rows(check, "dout", dout);
  check_rows(check, "y", y, "dout", dout);
  check_same_width(check, "y", y, "dout", dout);
  const int64_t T = dout.dim(0);
  check_weights(check, "dweights", dweights, T, top_k);
  check_route_index(check, route_index, T, top_k, y.dim(0), /*injective=*/false);
  MOE_OP_DISPATCH(dout.device, combine_rows_weight_grad, dweights, dout, y, route_index, top_k, stream);
}

void invert_route_index(Tensor route_of_row, Tensor route_index, Stream stream) {
  const OpCheck check("invert_route_index", route_index.device);
  check.tensor("route_index", route_index, DType::I32, 1);
  check.tensor("route_of_row", route_of_row, DType::I32, 1);
  check_route_index(check, route_index, route_index.numel(), 1, route_of_row.numel(), /*injective=*/true);
  MOE_OP_DISPATCH(route_index.device, invert_route_index, route_of_row, route_index, stream);
}

}  // namespace moe

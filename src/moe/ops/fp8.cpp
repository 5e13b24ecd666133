#include "moe/ops/fp8.h"

#include <string>

#include "moe/ops/cpu/fp8.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/fp8_checks.h"
#include "moe/ops/fp8_reference.h"
#include "moe/ops/kernel_choice.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/fp8.h")
#include "moe/ops/cuda/fp8.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

namespace {

int64_t tiles_along(int64_t n) { return (n + kFp8Tile - 1) / kFp8Tile; }

const char* tiles_name(Fp8Tiles tiles) {
  switch (tiles) {
    case Fp8Tiles::Rows: return "Rows (1 x 128)";
    case Fp8Tiles::Blocks: return "Blocks (128 x 128)";
    case Fp8Tiles::Columns: return "Columns (1 x 128, tile-major scales)";
  }
  return "unknown";
}

// A default-constructed Tensor (no shape, no data) or one without elements: not given.
bool not_given(const Tensor& t) { return t.numel() == 0 || (t.ndim() == 0 && t.data == nullptr); }

// Segment offsets [G + 1] I32 (offsets[0] = 0, non-decreasing, offsets[G] <= rows when rows >= 0),
// checked where the host can read them. Returns G.
int64_t check_segment_offsets(const OpCheck& check, const char* name, const Tensor& offsets, int64_t rows) {
  const char* op = check.op();
  check.tensor(name, offsets, DType::I32, 1);
  const int64_t G = offsets.dim(0) - 1;
  MOE_CHECK(G >= 1, op, ": ", name, " has shape ", offsets.shape.str(), ", expected [G + 1] with G >= 1 segments");
  if (!check.host_data()) return G;
  const int32_t* o = offsets.i32();
  MOE_CHECK(o[0] == 0, op, ": ", name, "[0] = ", o[0], ", expected 0 (segments start at the first row)");
  for (int64_t g = 0; g < G; ++g)
    MOE_CHECK(o[g] <= o[g + 1], op, ": ", name, " decrease at segment ", g, " (", o[g], " > ", o[g + 1], ")");
  if (rows >= 0) MOE_CHECK(o[G] <= rows, op, ": ", name, "[", G, "] = ", o[G], " exceeds the ", rows, " rows");
  return G;
}

// The column where segment G would start (p_G of the columns layout) for host-readable offsets.
int64_t padded_columns_end(const Tensor& offsets) {
  const int32_t* o = offsets.i32();
  int64_t end = 0;
  for (int64_t g = 0; g + 1 < offsets.numel(); ++g) end += tiles_along(o[g + 1] - o[g]) * kFp8Tile;
  return end;
}

}  // namespace

void check_fp8(const OpCheck& check, const char* name, const Fp8Tensor& t, Fp8Tiles tiles, int min_ndim,
               int max_ndim) {
  const char* op = check.op();
  const std::string codes = std::string(name) + ".codes", scales = std::string(name) + ".scales";
  MOE_CHECK(t.tiles == tiles, op, ": ", name, " has ", tiles_name(t.tiles), " tiles, expected ", tiles_name(tiles));
  check.tensor(codes.c_str(), t.codes, DType::FP8_E4M3);
  MOE_CHECK(t.codes.ndim() >= min_ndim && t.codes.ndim() <= max_ndim, op, ": ", codes, " must be ", min_ndim, "-D",
            min_ndim == max_ndim ? std::string() : " or " + std::to_string(max_ndim) + "-D", ", got ",
            t.codes.shape.str());
  check.tensor(scales.c_str(), t.scales, DType::F32);
  check.shape(scales.c_str(), t.scales, fp8_scale_shape(t.codes.shape, tiles));
}

void check_f32_or_bf16(const OpCheck& check, const char* name, const Tensor& t) {
  check.on_device(name, t);
  MOE_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, check.op(), ": ", name, " must be F32 or BF16, got ",
            dtype_name(t.dtype));
}

void check_columns_layout(const OpCheck& check, const char* name, const Fp8Tensor& out, int64_t M, int64_t K,
                          const Tensor& offsets) {
  check_fp8(check, name, out, Fp8Tiles::Columns, 2, 2);
  const int64_t G = not_given(offsets) ? 1 : check_segment_offsets(check, "offsets", offsets, M);
  const int64_t capacity = fp8_columns_capacity(M, G);
  MOE_CHECK(out.codes.dim(0) == K && out.codes.dim(1) >= capacity, check.op(), ": ", name, ".codes has shape ",
            out.codes.shape.str(), ", expected [", K, ", Mp] with Mp >= ", capacity,
            " (fp8_columns_capacity(", M, " rows, ", G, " segments))");
}

void check_columns_operand(const OpCheck& check, const char* name, const Fp8Tensor& out, const Tensor& x,
                           const Tensor& offsets) {
  check_f32_or_bf16(check, "x", x);
  check.ndim("x", x, 2);
  check_columns_layout(check, name, out, x.dim(0), x.dim(1), offsets);
}

void check_block_caches(const OpCheck& check, const Fp8Tensor& out, const Fp8Tensor& out_t, const Tensor& w,
                        const char* w_name) {
  check.tensor(w_name, w, DType::F32);
  MOE_CHECK(w.ndim() == 2 || w.ndim() == 3, check.op(), ": ", w_name, " must be [N, K] or [E, N, K], got ",
            w.shape.str());
  check_fp8(check, "out", out, Fp8Tiles::Blocks, 2, 3);
  check.same_shape("out.codes", out.codes, w_name, w);
  if (!(out_t.codes.ndim() == 0 && out_t.codes.data == nullptr)) {  // the transposed orientation is asked for
    check_fp8(check, "out_t", out_t, Fp8Tiles::Blocks, 2, 3);
    Shape transposed = w.shape;
    transposed.dims[w.ndim() - 2] = w.dim(-1);
    transposed.dims[w.ndim() - 1] = w.dim(-2);
    check.shape("out_t.codes", out_t.codes, transposed);
  }
}

Shape fp8_scale_shape(const Shape& codes, Fp8Tiles tiles) {
  MOE_CHECK(codes.ndim >= 2, "fp8_scale_shape: codes must have rank >= 2, got ", codes.str());
  if (tiles == Fp8Tiles::Columns) {
    MOE_CHECK(codes.ndim == 2, "fp8_scale_shape: Columns codes must be [K, Mp], got ", codes.str());
    return Shape{tiles_along(codes[1]), codes[0]};
  }
  Shape s = codes;
  s.dims[s.ndim - 1] = tiles_along(codes[codes.ndim - 1]);
  if (tiles == Fp8Tiles::Blocks) s.dims[s.ndim - 2] = tiles_along(codes[codes.ndim - 2]);
  return s;
}

int64_t fp8_columns_capacity(int64_t rows, int64_t segments) {
  MOE_CHECK(rows >= 0 && segments >= 1, "fp8_columns_capacity: needs rows >= 0 and segments >= 1, got rows=", rows,
            " segments=", segments);
  return tiles_along(rows) * kFp8Tile + kFp8Tile * (segments - 1);
}

void fp8_quantize_rows(Fp8Tensor out, Tensor x, Stream stream) {
  const OpCheck check("fp8_quantize_rows", x.device);
  check_f32_or_bf16(check, "x", x);
  check.ndim("x", x, 2);
  check_fp8(check, "out", out, Fp8Tiles::Rows, 2, 2);
  check.same_shape("out.codes", out.codes, "x", x);
  MOE_OP_DISPATCH(x.device, fp8_quantize_rows, out, x, stream);
}


void fp8_quantize_columns(Fp8Tensor out, Tensor x, Tensor offsets, Stream stream) {
  const OpCheck check("fp8_quantize_columns", x.device);
  check_columns_operand(check, "out", out, x, offsets);
  MOE_OP_DISPATCH(x.device, fp8_quantize_columns, out, x, offsets, stream);
}

void fp8_quantize_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, Tensor x, Tensor offsets, Stream stream) {
  const OpCheck check("fp8_quantize_rows_and_columns", x.device);
  check_columns_operand(check, "columns", columns, x, offsets);
  check_fp8(check, "rows", rows, Fp8Tiles::Rows, 2, 2);
  check.same_shape("rows.codes", rows.codes, "x", x);
  MOE_OP_DISPATCH(x.device, fp8_quantize_rows_and_columns, rows, columns, x, offsets, stream);
}

void fp8_quantize_blocks(Fp8Tensor out, Fp8Tensor out_t, Tensor w, Stream stream) {
  const OpCheck check("fp8_quantize_blocks", w.device);
  check_block_caches(check, out, out_t, w);
  MOE_OP_DISPATCH(w.device, fp8_quantize_blocks, out, out_t, w, stream);
}

void fp8_dequantize(Tensor out, Fp8Tensor in, Stream stream) {
  const OpCheck check("fp8_dequantize", out.device);
  check_f32_or_bf16(check, "out", out);
  check_fp8(check, "in", in, in.tiles, 2, in.tiles == Fp8Tiles::Blocks ? 3 : 2);
  check.same_shape("out", out, "in.codes", in.codes);
  MOE_OP_DISPATCH(out.device, fp8_dequantize, out, in, stream);
}

void fp8_matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, bool accumulate, Stream stream) {
  const OpCheck check("fp8_matmul", c.device);
  const char* op = check.op();
  check.compute_dtype("c", c);
  check.ndim("c", c, 2);
  MOE_CHECK(a.tiles != Fp8Tiles::Blocks, op, ": a has Blocks (128 x 128) tiles, expected Rows or Columns (1 x 128)");
  check_fp8(check, "a", a, a.tiles, 2, 2);
  check_fp8(check, "b", b, b.tiles, 2, 2);
  const int64_t M = a.codes.dim(0), K = a.codes.dim(1), N = b.codes.dim(0);
  MOE_CHECK(b.codes.dim(1) == K, op, ": b.codes ", b.codes.shape.str(), " does not match a.codes ",
            a.codes.shape.str(), " in the inner dimension (both are [rows, K])");
  MOE_CHECK(c.dim(0) == M && c.dim(1) == N, op, ": c has shape ", c.shape.str(), ", expected [", M, ", ", N,
            "] from a.codes ", a.codes.shape.str(), " and b.codes ", b.codes.shape.str());
  constexpr int64_t kIntMax = 2147483647;
  MOE_CHECK(M <= kIntMax && N <= kIntMax && K <= kIntMax, op, ": dimensions M=", M, " N=", N, " K=", K,
            " exceed the BLAS int range");
  if (c.device == Device::CUDA && kernel_choice() == KernelChoice::Reference)
    return fp8_reference::matmul(c, a, b, accumulate, stream);
  MOE_OP_DISPATCH(c.device, fp8_matmul, c, a, b, accumulate, stream);
}

void fp8_grouped_matmul(Tensor c, Fp8Tensor a, Fp8Tensor b, Tensor expert_offsets, Stream stream) {
  const OpCheck check("fp8_grouped_matmul", c.device);
  const char* op = check.op();
  check.compute_dtype("c", c);
  check.ndim("c", c, 2);
  check_fp8(check, "a", a, Fp8Tiles::Rows, 2, 2);
  check_fp8(check, "b", b, Fp8Tiles::Blocks, 3, 3);
  const int64_t K = a.codes.dim(1), N = b.codes.dim(1);
  MOE_CHECK(b.codes.dim(2) == K, op, ": b.codes ", b.codes.shape.str(), " does not match a.codes ",
            a.codes.shape.str(), " in the inner dimension (b is [E, N, K])");
  MOE_CHECK(c.dim(1) == N, op, ": c has ", c.dim(1), " columns, expected ", N, " from b.codes ",
            b.codes.shape.str());
  MOE_CHECK(K >= 1 && N >= 1, op, ": empty inner or output dimension (a.codes ", a.codes.shape.str(), ", b.codes ",
            b.codes.shape.str(), ")");
  const int64_t rows = a.codes.dim(0) < c.dim(0) ? a.codes.dim(0) : c.dim(0);
  check.expert_offsets(expert_offsets, b.codes.dim(0), rows);
  if (c.device == Device::CUDA && kernel_choice() == KernelChoice::Reference)
    return fp8_reference::grouped_matmul(c, a, b, expert_offsets, stream);
  MOE_OP_DISPATCH(c.device, fp8_grouped_matmul, c, a, b, expert_offsets, stream);
}

void fp8_grouped_matmul_wgrad(Tensor db, Fp8Tensor dc_t, Fp8Tensor x_t, Tensor expert_offsets, bool accumulate,
                              Stream stream) {
  const OpCheck check("fp8_grouped_matmul_wgrad", db.device);
  const char* op = check.op();
  check.tensor("db", db, DType::F32, 3);
  check_fp8(check, "dc_t", dc_t, Fp8Tiles::Columns, 2, 2);
  check_fp8(check, "x_t", x_t, Fp8Tiles::Columns, 2, 2);
  const int64_t E = db.dim(0), N = db.dim(1), K = db.dim(2), Mp = x_t.codes.dim(1);
  MOE_CHECK(dc_t.codes.dim(0) == N, op, ": dc_t.codes has ", dc_t.codes.dim(0), " rows, expected ", N,
            " (db's N) from db ", db.shape.str());
  MOE_CHECK(x_t.codes.dim(0) == K, op, ": x_t.codes has ", x_t.codes.dim(0), " rows, expected ", K,
            " (db's K) from db ", db.shape.str());
  MOE_CHECK(dc_t.codes.dim(1) == Mp, op, ": dc_t.codes ", dc_t.codes.shape.str(), " and x_t.codes ",
            x_t.codes.shape.str(), " must have the same columns (both quantized with expert_offsets)");
  MOE_CHECK(K >= 1 && N >= 1, op, ": db ", db.shape.str(), " has an empty dimension");
  check_segment_offsets(check, "expert_offsets", expert_offsets, -1);
  MOE_CHECK(expert_offsets.dim(0) == E + 1, op, ": expert_offsets has shape ", expert_offsets.shape.str(),
            ", expected [", E + 1, "] (experts + 1)");
  if (check.host_data()) {
    const int64_t end = padded_columns_end(expert_offsets);
    MOE_CHECK(end <= Mp, op, ": the experts' padded column segments end at column ", end, ", past the ", Mp,
              " columns of x_t.codes (quantize with fp8_columns_capacity columns and the same expert_offsets)");
  }
  MOE_OP_DISPATCH(db.device, fp8_grouped_matmul_wgrad, db, dc_t, x_t, expert_offsets, accumulate, stream);
}

}  // namespace moe

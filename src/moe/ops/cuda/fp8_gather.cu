// FP8 operands of gathered token rows (moe/ops/fp8_gather.h): the columns quantizer of
// fp8_tiles.cuh (one block per 128 x 128 tile, with or without the Rows output) with a Source that
// loads each buffer row's 16-feature runs from its token's row, scaled by the route's weight and
// rounded as combine_rows_backward rounds (__fmul_rn, then to the element type): the codes and
// scales of quantizing the stored rows, without the scatter's or the combine backward's store of
// them and the quantizer's read back (two bytes per element each).
//
// NOTES: the weighted rows in both layouts (bench-olmoe-4l's expert output gradient) run at 1.32 ms
// per layer here, where the staged quantizer (fp8_rows_and_columns_staged.cuh) takes 0.97 for the
// stored gradient. A staged form with a row source that gathers the tile's rows by cp.async and
// weighs the stage in place (its weights copied by cp.async with the rows) ran at 1.44 ms and made
// the step 0.5% slower (bench/RESULTS.md, 2026-12-03 eleventh session), so it was not kept. Nor
// was the rows half moved into the FP8 dispatch's per-token scatter with the route weights (each
// token row read once): weighted columns alone ~0.75 ms plus that scatter 0.55 ms, the same as this
// one pass (thirteenth session): the kernel is bound by its per-element work, not by its reads.
// Nor did ordering the column tiles by token (a sort before each call, so a token row's top_k reads
// hit L2 instead of HBM) help: 1.32 -> 1.35 ms and 0.565 -> 0.56 ms per layer (fourteenth session).
#include "moe/ops/cuda/fp8_gather.h"

#include "moe/ops/cuda/fp8_tiles.cuh"

namespace moe::cuda {
namespace {

using namespace fp8_tiles;

// Columns source: features kw .. kw + features - 1 of buffer row `row`, that is of token row
// route / top_k (times weights[route] unless weights is null). A row no route fills stays zero.
// vector: 16-byte loads of every token row are aligned.
template <typename T>
struct GatheredColumns {
  const T* x = nullptr;
  int64_t K = 0;
  const int32_t* route_of_row = nullptr;
  const float* weights = nullptr;
  int top_k = 1;
  int64_t routes = 0;
  __device__ __forceinline__ void load(Run16<T>& run, int64_t row, int64_t kw, int features, bool vector) const {
    const int32_t route = route_of_row[row];
    if (route < 0 || route >= routes) return;
    const T* p = x + static_cast<int64_t>(route / top_k) * K + kw;
    if (weights == nullptr) {
      run.load(p, features, vector);
      return;
    }
    Run16<T> v;
    v.load(p, features, vector);
    const float w = weights[route];
#pragma unroll
    for (int f = 0; f < kRun; ++f)
      if (f < features) run.set(f, __fmul_rn(w, v.get(f)));
  }
};

template <typename T>
void launch(const Fp8Tensor& columns, const GatheredRows& src, const Tensor& offsets, const Fp8Tensor* rows,
            const char* op, cudaStream_t s) {
  const int64_t M = src.route_of_row.dim(0), K = src.x.dim(1), Mp = columns.codes.dim(-1);
  if (K == 0 || Mp == 0) return;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const bool vector = K % kVec == 0 && aligned(src.x.data, 16);
  const GatheredColumns<T> source{src.x.ptr<const T>(),
                                  K,
                                  src.route_of_row.ptr<const int32_t>(),
                                  src.weights.empty() ? nullptr : src.weights.ptr<const float>(),
                                  src.top_k,
                                  src.x.dim(0) * src.top_k};
  launch_columns<T>(columns, source, offsets, M, K, Mp, vector, rows, op, s);
}

void quantize(const Fp8Tensor& columns, const GatheredRows& src, const Tensor& offsets, const Fp8Tensor* rows,
              const char* op, Stream stream) {
  const cudaStream_t s = cuda_stream(stream);
  if (src.x.dtype == DType::BF16)
    launch<__nv_bfloat16>(columns, src, offsets, rows, op, s);
  else
    launch<float>(columns, src, offsets, rows, op, s);
}

}  // namespace

void fp8_quantize_gathered_columns(Fp8Tensor columns, const GatheredRows& src, Tensor offsets, Stream stream) {
  quantize(columns, src, offsets, nullptr, "fp8_quantize_gathered_columns", stream);
}

void fp8_quantize_gathered_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, const GatheredRows& src,
                                            Tensor offsets, Stream stream) {
  quantize(columns, src, offsets, &rows, "fp8_quantize_gathered_rows_and_columns", stream);
}

}  // namespace moe::cuda

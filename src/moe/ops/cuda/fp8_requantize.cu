// FP8 rows re-quantized along the tokens (moe/ops/fp8_requantize.h): the columns quantizer of
// fp8_tiles.cuh with a Source that decodes the rows' codes and scales (the dequantize kernel's
// values) and rounds the values to the `values` type as fp8_dequantize stores them, so the result
// is bit for bit dequantize-then-quantize. One pass: a byte per element
// read instead of the dequantized tensor's write and read (two or four bytes each way).
#include "moe/ops/cuda/fp8_requantize.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "moe/ops/cuda/fp8_tiles.cuh"

namespace moe::cuda {
namespace {

using namespace fp8_tiles;

// E4M3 code -> its value: the hardware conversion to FP16 (exact: every E4M3 value is an FP16
// value), then to FP32 (exact). fp8::e4m3_to_f32's bits for every code but the NaNs, which stay NaN
// (what the quantizer makes of any NaN is the same). The portable decode made this kernel
// compute-bound (1.4 ms for bench-olmoe-4l's expert input).
__device__ __forceinline__ float e4m3_value(uint8_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3)));
}

// Columns source: features kw .. kw + 15 of row `row` of the Rows-tiled codes [M, K] (one scale: a
// 16-feature run never crosses a 128-feature tile). vector: one aligned 16-byte load of codes.
template <typename T>
struct Fp8RowsColumns {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  int64_t K = 0, row_tiles = 0;
  __device__ __forceinline__ void load(Run16<T>& run, int64_t row, int64_t kw, int features, bool vector) const {
    const float scale = scales[row * row_tiles + kw / kTile];
    const uint8_t* p = codes + row * K + kw;
    if (vector && features == kRun) {
      const uint4 c = *reinterpret_cast<const uint4*>(p);
      const uint32_t words[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
      for (int f = 0; f < kRun; ++f)
        run.set(f, e4m3_value(static_cast<uint8_t>(words[f / 4] >> (8 * (f % 4)))) * scale);
      return;
    }
    for (int f = 0; f < features; ++f) run.set(f, e4m3_value(p[f]) * scale);
  }
};

template <typename T>
void launch(const Fp8Tensor& out, const Fp8Tensor& x, const Tensor& offsets, cudaStream_t s) {
  const int64_t M = x.codes.dim(0), K = x.codes.dim(1), Mp = out.codes.dim(-1);
  const bool vector = K % kRun == 0 && aligned(x.codes.data, 16);
  const Fp8RowsColumns<T> src{x.codes.ptr<const uint8_t>(), x.scales.ptr<const float>(), K, tiles(K)};
  launch_columns<T>(out, src, offsets, M, K, Mp, vector, nullptr, "fp8_requantize_columns", s);
}

}  // namespace

void fp8_requantize_columns(Fp8Tensor out, Fp8Tensor x, DType values, Tensor offsets, Stream stream) {
  if (x.codes.dim(-1) == 0 || out.codes.dim(-1) == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (values == DType::BF16)
    launch<__nv_bfloat16>(out, x, offsets, s);
  else
    launch<float>(out, x, offsets, s);
}

}  // namespace moe::cuda

// The RMSNorm forward that quantizes its output (semantics: moe/ops/fp8_norm.h): the norm's row
// kernel (rmsnorm_rows.cuh) with a sink that stores each lane's run of the row and quantizes it.
// A lane holds kVec consecutive columns (16 bytes of T), so a 1 x 128 tile is 128 / kVec
// consecutive lanes of one access (16 for BF16, 32 for F32): the tile's amax is a shuffle
// reduction over them, its scale and codes those of fp8_quantize_rows (TileQuantizer, the values
// rounded to T as stored). That needs every access of a row whole (C a multiple of 32 kVec, so no
// lane sits out a shuffle) and the 16-byte path; other shapes run the norm and the rows quantizer
// one after the other (the same bits).
#include "moe/ops/cuda/fp8_norm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "moe/core/cuda_check.h"
#include "moe/core/fp8.h"
#include "moe/ops/cuda/element.cuh"
#include "moe/ops/cuda/fp8.h"
#include "moe/ops/cuda/fp8_tiles.cuh"
#include "moe/ops/cuda/norm.h"
#include "moe/ops/cuda/rmsnorm_rows.cuh"

namespace moe::cuda {
namespace {

using namespace rmsnorm_rows;

template <typename T, int kVec>
struct QuantizingRows {
  T* out;
  uint8_t* codes;
  float* scales;
  int64_t C, row_tiles;
  __device__ __forceinline__ void write(int64_t r, int64_t c, int lane, const float (&y)[kVec]) const {
    constexpr int kGroup = fp8_tiles::kTile / kVec;  // lanes per tile
    VecAccess<T, kVec>::store(out + r * C + c, y);
    float stored[kVec];
    uint32_t amax = 0;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      stored[j] = to_f32(from_f32<T>(y[j]));
      amax = max(amax, fp8_tiles::magnitude_bits(stored[j]));
    }
#pragma unroll
    for (int d = kGroup / 2; d > 0; d >>= 1) amax = max(amax, __shfl_xor_sync(fp8_tiles::kFullMask, amax, d));
    const float scale = fp8::tile_scale(__uint_as_float(amax));
    if (lane % kGroup == 0) scales[r * row_tiles + c / fp8_tiles::kTile] = scale;
    const fp8_tiles::TileQuantizer quantize(scale);
    uint32_t words[kVec / 4];
#pragma unroll
    for (int j = 0; j < kVec / 4; ++j)
      words[j] = quantize.word(stored[4 * j], stored[4 * j + 1], stored[4 * j + 2], stored[4 * j + 3]);
    fp8_tiles::store_codes<kVec>(codes + r * C + c, kVec, true, words);
  }
};

template <typename T>
void launch(Tensor out, Tensor rstd, Fp8Tensor out_rows, Tensor x, Tensor weight, float eps, int64_t R, int64_t C,
            cudaStream_t s) {
  constexpr int kVec = kVecOf<T>;
  const QuantizingRows<T, kVec> sink{out.ptr<T>(), out_rows.codes.ptr<uint8_t>(), out_rows.scales.ptr<float>(), C,
                                     fp8_tiles::tiles(C)};
  const unsigned blocks = static_cast<unsigned>((R + kWarpsPerBlock - 1) / kWarpsPerBlock);
  rmsnorm_forward_kernel<T, kVec><<<blocks, kRowThreads, 0, s>>>(sink, rstd.ptr<float>(), x.ptr<const T>(),
                                                                 weight.ptr<const T>(), eps, R, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void fp8_rmsnorm_forward(Tensor out, Tensor rstd, Fp8Tensor out_rows, Tensor x, Tensor weight, float eps,
                         Stream stream) {
  const int64_t C = weight.dim(0), R = rstd.numel();
  if (R == 0 || C == 0) return;
  const int64_t vec = x.dtype == DType::F32 ? 4 : 8;
  const bool fused = C % (32 * vec) == 0 && fp8_tiles::aligned(out.data, 16) && fp8_tiles::aligned(x.data, 16) &&
                     fp8_tiles::aligned(weight.data, 16) && fp8_tiles::aligned(out_rows.codes.data, 16);
  if (!fused) {
    cuda::rmsnorm_forward(out, rstd, x, weight, eps, stream);
    return cuda::fp8_quantize_rows(out_rows, out.view({R, C}), stream);
  }
  const cudaStream_t s = cuda_stream(stream);
  if (x.dtype == DType::F32)
    launch<float>(out, rstd, out_rows, x, weight, eps, R, C, s);
  else
    launch<__nv_bfloat16>(out, rstd, out_rows, x, weight, eps, R, C, s);
}

}  // namespace moe::cuda

// The CPU's gathered FP8 operands are the composition they are defined as (moe/ops/fp8_gather.h):
// the expert-major rows built in a temporary tensor, then quantized.
#include "moe/ops/cpu/fp8_gather.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "moe/ops/cpu/fp8.h"

namespace moe::cpu {

namespace {

// Row r of the gathered tensor into out (x's dtype): zeros, x[t], or weights[i] * x[t] rounded to
// x's dtype (the FP32 product combine_rows_backward rounds).
void gather_row(void* out, const GatheredRows& src, int32_t route) {
  const int64_t D = src.x.dim(1);
  const size_t row_bytes = static_cast<size_t>(D) * dtype_size(src.x.dtype);
  if (route < 0) {
    std::memset(out, 0, row_bytes);
    return;
  }
  const int64_t t = route / src.top_k;
  const char* x_row = static_cast<const char*>(src.x.data) + static_cast<size_t>(t) * row_bytes;
  if (src.weights.empty()) {
    std::memcpy(out, x_row, row_bytes);
    return;
  }
  const float w = src.weights.f32()[route];
  if (src.x.dtype == DType::F32) {
    const float* x = reinterpret_cast<const float*>(x_row);
    float* o = static_cast<float*>(out);
    for (int64_t j = 0; j < D; ++j) o[j] = w * x[j];
  } else {
    const uint16_t* x = reinterpret_cast<const uint16_t*>(x_row);
    uint16_t* o = static_cast<uint16_t*>(out);
    for (int64_t j = 0; j < D; ++j) o[j] = f32_to_bf16(w * bf16_to_f32(x[j]));
  }
}

// The gathered rows [M, D] in `storage`.
Tensor gather(std::vector<std::byte>& storage, const GatheredRows& src) {
  const int64_t M = src.route_of_row.dim(0), D = src.x.dim(1);
  const size_t row_bytes = static_cast<size_t>(D) * dtype_size(src.x.dtype);
  storage.resize(static_cast<size_t>(M) * row_bytes);
  const int32_t* routes = src.route_of_row.i32();
#pragma omp parallel for schedule(static) if (M * D >= (1 << 15))
  for (int64_t r = 0; r < M; ++r) gather_row(storage.data() + static_cast<size_t>(r) * row_bytes, src, routes[r]);
  return Tensor(storage.data(), src.x.dtype, Shape{M, D}, Device::CPU);
}

}  // namespace

void fp8_quantize_gathered_columns(Fp8Tensor columns, const GatheredRows& src, Tensor offsets, Stream stream) {
  std::vector<std::byte> storage;
  cpu::fp8_quantize_columns(columns, gather(storage, src), offsets, stream);
}

void fp8_quantize_gathered_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, const GatheredRows& src,
                                            Tensor offsets, Stream stream) {
  std::vector<std::byte> storage;
  cpu::fp8_quantize_rows_and_columns(rows, columns, gather(storage, src), offsets, stream);
}

}  // namespace moe::cpu

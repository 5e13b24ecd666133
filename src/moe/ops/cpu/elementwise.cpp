// CPU element-wise helpers: OpenMP loops over the elements, memset/memcpy for zeroing and copies.
#include "moe/ops/cpu/elementwise.h"

#include <cstring>

#include "moe/core/dtype.h"

namespace moe::cpu {

void add_inplace(Tensor y, Tensor x, Stream /*stream*/) {
  const int64_t n = y.numel();
  float* yp = y.f32();
  const float* xp = x.f32();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) yp[i] += xp[i];
}

void fill_zero(Tensor y, Stream /*stream*/) {
  if (y.nbytes() > 0) std::memset(y.data, 0, y.nbytes());
}

void copy(Tensor dst, Tensor src, Stream /*stream*/) {
  if (dst.nbytes() > 0 && dst.data != src.data) std::memcpy(dst.data, src.data, dst.nbytes());
}

void cast_copy(Tensor dst, Tensor src, Stream stream) {
  if (dst.dtype == src.dtype) return cpu::copy(dst, src, stream);  // qualified: moe::copy is visible too
  const int64_t n = dst.numel();
  if (dst.dtype == DType::BF16) {  // from F32
    const float* s = src.f32();
    uint16_t* d = dst.ptr<uint16_t>();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
  } else {  // BF16 to F32
    const uint16_t* s = src.ptr<const uint16_t>();
    float* d = dst.f32();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
  }
}

void accumulate_scalars(Tensor stats, const std::vector<ScalarTerm>& terms, Stream /*stream*/) {
  float* s = static_cast<float*>(stats.data);
  for (const ScalarTerm& term : terms) {
    const float value = term.src.dtype == DType::I32 ? static_cast<float>(term.src.ptr<const int32_t>()[term.index])
                                                     : term.src.ptr<const float>()[term.index];
    s[term.slot] += term.scale * value;
  }
}

}  // namespace moe::cpu

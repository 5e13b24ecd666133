// The AdamW update of one element and the step's scalars, shared by the flat update (optim.cu) and
// the update that also writes the FP8 caches of a quantized weight (fp8_adamw.cu), so both give the
// same bits. Semantics: moe/ops/optim.h. Include only from .cu files (device code).
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moe/ops/optim.h"

namespace moe::cuda::adamw_math {

// The update of one element. Every operation is an explicitly rounded intrinsic, so the compiler
// contracts nothing into an FMA: the float4 and the one-by-one loops give the same bits (with plain
// operators the two loops were contracted differently and differed in the last bit), and the
// operations are the CPU op's, in its order.
struct AdamWScalars {
  float b1, b2, eps, step_size, bias2_sqrt, decay, clip;
};

__device__ __forceinline__ float adamw_update(float p, float grad, float& m, float& v, const AdamWScalars& s) {
  const float g = __fmul_rn(s.clip, grad);
  m = __fadd_rn(__fmul_rn(s.b1, m), __fmul_rn(__fsub_rn(1.0f, s.b1), g));
  v = __fadd_rn(__fmul_rn(s.b2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, s.b2), g), g));
  // Same operation order as torch: (m / (sqrt(v) / sqrt(bias2) + eps)) times the step size.
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias2_sqrt), s.eps);
  return __fsub_rn(__fmul_rn(p, s.decay), __fmul_rn(s.step_size, __fdiv_rn(m, denom)));
}

// adamw_update of four consecutive elements (a float4 run of each operand).
__device__ __forceinline__ void adamw_update4(float4& p, const float4& g, float4& m, float4& v, const AdamWScalars& s) {
  p.x = adamw_update(p.x, g.x, m.x, v.x, s);
  p.y = adamw_update(p.y, g.y, m.y, v.y, s);
  p.z = adamw_update(p.z, g.z, m.z, v.z, s);
  p.w = adamw_update(p.w, g.w, m.w, v.w, s);
}

// Moments stored as FP32 or BF16 (optim.moment_dtype): loads widen exactly, stores round to
// nearest even (__float2bfloat16_rn, the CPU's f32_to_bf16 for every non-NaN value). load4/store4
// move elements [4j, 4j + 4) as one 16-byte float4 (FP32) or one 8-byte uint2 of two bfloat162
// (BF16: the moments, and the param's BF16 copy).
__device__ __forceinline__ float load_moment(const float* m, int64_t i) { return m[i]; }
__device__ __forceinline__ float load_moment(const __nv_bfloat16* m, int64_t i) { return __bfloat162float(m[i]); }
__device__ __forceinline__ void store_moment(float* m, int64_t i, float x) { m[i] = x; }
__device__ __forceinline__ void store_moment(__nv_bfloat16* m, int64_t i, float x) { m[i] = __float2bfloat16_rn(x); }

__device__ __forceinline__ float4 load4(const float* m, int64_t j) {
  return reinterpret_cast<const float4*>(m)[j];
}
__device__ __forceinline__ float4 load4(const __nv_bfloat16* m, int64_t j) {
  const uint2 packed = reinterpret_cast<const uint2*>(m)[j];
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ void store4(float* m, int64_t j, float4 x) { reinterpret_cast<float4*>(m)[j] = x; }
__device__ __forceinline__ void store4(__nv_bfloat16* m, int64_t j, float4 x) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
  uint2 packed;
  packed.x = *reinterpret_cast<const uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const uint32_t*>(&hi);
  reinterpret_cast<uint2*>(m)[j] = packed;
}

// The step's scalars into s, or false when the step is skipped (a non-finite grad_norm_sq[0]: the
// caller returns without touching anything). schedule == nullptr: step_size, bias2_sqrt and decay
// are the host's. Otherwise thread 0 computes them from lr = schedule[0], step = schedule[1] and the
// weight decay wd, in double as the host does (pow and sqrt, then __dmul_rn/__dadd_rn so nothing is
// fused into a multiply-add the host would round twice), and a barrier shares them: every thread
// of the block must call this.
__device__ __forceinline__ bool step_scalars(const float* grad_norm_sq, float max_norm, float b1, float b2, float eps,
                                             float step_size, float bias2_sqrt, float decay, const float* schedule,
                                             float wd, AdamWScalars& s) {
  if (schedule != nullptr) {
    __shared__ float scalars[3];
    if (threadIdx.x == 0) {
      const double lr = schedule[0], step = schedule[1];
      const double bias1 = 1.0 - pow(static_cast<double>(b1), step);
      const double bias2 = 1.0 - pow(static_cast<double>(b2), step);
      scalars[0] = static_cast<float>(lr / bias1);
      scalars[1] = static_cast<float>(sqrt(bias2));
      scalars[2] = static_cast<float>(__dadd_rn(1.0, -__dmul_rn(lr, static_cast<double>(wd))));
    }
    __syncthreads();
    step_size = scalars[0];
    bias2_sqrt = scalars[1];
    decay = scalars[2];
  }
  const float norm_sq = grad_norm_sq[0];
  if (!isfinite(norm_sq)) return false;  // skip the step: a non-finite gradient changes nothing
  const float clip =
      max_norm > 0.0f ? fminf(1.0f, static_cast<float>(max_norm / (sqrt(static_cast<double>(norm_sq)) + 1e-6)))
                      : 1.0f;
  s = AdamWScalars{b1, b2, eps, step_size, bias2_sqrt, decay, clip};
  return true;
}

// The step's scalars computed on the host (without a schedule), in double as torch computes them in
// Python and the CPU op does.
struct HostScalars {
  float step_size = 0.0f, bias2_sqrt = 0.0f, decay = 0.0f;
};
inline HostScalars host_scalars(const AdamWConfig& cfg, int64_t step) {
  const double bias1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), static_cast<double>(step));
  return {static_cast<float>(cfg.lr / bias1), static_cast<float>(std::sqrt(bias2)),
          static_cast<float>(1.0 - static_cast<double>(cfg.lr) * cfg.weight_decay)};
}

}  // namespace moe::cuda::adamw_math

// FP8 E4M3 scalars and power-of-two tile scales: one definition for the CPU and the GPU kernels, so
// the two quantize to the same bits.
//
// Format: OCP FP8 E4M3 (CUDA's __nv_fp8_e4m3, "E4M3FN"): sign, 4 exponent bits (bias 7), 3 mantissa
// bits; largest finite 448, smallest subnormal 2^-9; no infinities; 0x7F and 0xFF are NaN.
// Encoding rounds to nearest even and saturates finite values (and infinities) to +-448; NaN stays NaN.
//
// Scales are powers of two (as DeepSeek-V3.1's UE8M0 scales, where DeepSeek-V3 used any FP32): a
// tile's scale is the smallest 2^k with amax / 2^k <= 448. Dividing by it and multiplying back are
// exact exponent shifts, so the only rounding is the E4M3 rounding itself, the CPU and the GPU agree
// bit for bit, and a dequantized value is exact in FP32 and in BF16. The cost against an FP32 scale
// is at most one binade of range at the bottom of the tile.
#pragma once

#include <cstdint>
#include <cstring>

#include "moe/core/rng.h"  // MOE_HOST_DEVICE

namespace moe::fp8 {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr uint8_t kE4m3MaxCode = 0x7e;
inline constexpr uint8_t kE4m3NanCode = 0x7f;
inline constexpr int kMinScaleExponent = -126;  // scales stay normal FP32 numbers

MOE_HOST_DEVICE inline uint32_t float_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

MOE_HOST_DEVICE inline float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// x (FP32) to E4M3: round to nearest even, saturating; NaN to 0x7F with x's sign.
MOE_HOST_DEVICE inline uint8_t e4m3_from_f32(float x) {
  const uint32_t u = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | kE4m3NanCode;
  if (a >= 0x43e00000u) return sign | kE4m3MaxCode;  // >= 448 (and infinity): saturate
  if (a >= 0x3c800000u) {                             // >= 2^-6: an E4M3 normal number
    // Keep 3 of FP32's 23 mantissa bits, rounding to nearest even at bit 20; a carry into the
    // exponent is the correct next binade. Re-bias the exponent from 127 to 7 (127 - 7 = 120).
    const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    return sign | static_cast<uint8_t>(r - (120u << 3));  // below 448: at most 0x7e
  }
  // Subnormal E4M3: the multiple m of 2^-9, m in [0, 8] (8 is the smallest normal, code 0x08).
  const uint32_t exponent = a >> 23;
  if (exponent == 0) return sign;  // FP32 subnormal: far below 2^-10
  const uint32_t significand = (a & 0x7fffffu) | 0x800000u;  // value = significand * 2^(exponent - 150)
  const uint32_t shift = 141u - exponent;                    // m = significand * 2^-shift, shift >= 21
  if (shift > 24) return sign;                               // m < 0.5
  const uint32_t m = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1u), half = 1u << (shift - 1);
  const uint32_t rounded = m + ((rest > half || (rest == half && (m & 1u))) ? 1u : 0u);
  return sign | static_cast<uint8_t>(rounded);
}

// E4M3 to FP32, exact.
MOE_HOST_DEVICE inline float e4m3_to_f32(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t exponent = (c >> 3) & 0xfu, mantissa = c & 0x7u;
  if (exponent == 0xf && mantissa == 0x7) return bits_float(sign | 0x7fc00000u);
  if (exponent == 0) {
    const float v = static_cast<float>(mantissa) * 0.001953125f;  // mantissa * 2^-9, exact
    return sign ? -v : v;
  }
  return bits_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

// The exponent k of a tile's scale 2^k from the tile's largest magnitude (finite, >= 0): the
// smallest k >= kMinScaleExponent with amax <= 448 * 2^k. amax = 0 gives k = 0.
MOE_HOST_DEVICE inline int scale_exponent(float amax) {
  const uint32_t a = float_bits(amax) & 0x7fffffffu;
  if (a == 0) return 0;
  const int field = static_cast<int>(a >> 23);
  if (field == 0) return kMinScaleExponent;  // FP32 subnormal amax
  // amax = 1.f * 2^e; 448 = 1.75 * 2^8: amax fits 2^(e-8) exactly when 1.f <= 1.75.
  const int e = field - 127;
  const int k = (a & 0x7fffffu) <= 0x600000u ? e - 8 : e - 7;
  return k < kMinScaleExponent ? kMinScaleExponent : k;
}

// 2^k for k in [-126, 127] (normal FP32).
MOE_HOST_DEVICE inline float pow2(int k) { return bits_float(static_cast<uint32_t>(k + 127) << 23); }

// A tile's scale from its amax. A tile holding a NaN or an infinity gets a NaN scale and NaN codes
// (quantize_with_scale): the non-finite value reaches the GEMM output and the step's non-finite
// check instead of being clipped to 448.
MOE_HOST_DEVICE inline float tile_scale(float amax) {
  if (!(amax <= 3.402823466e38f)) return bits_float(0x7fc00000u);  // NaN or infinity
  return pow2(scale_exponent(amax));
}

// x's code in a tile with scale `scale` (tile_scale's result).
MOE_HOST_DEVICE inline uint8_t quantize_with_scale(float x, float scale) {
  if (!(scale == scale)) return kE4m3NanCode;
  const int k = static_cast<int>((float_bits(scale) >> 23) & 0xffu) - 127;
  return e4m3_from_f32(x * pow2(-k));  // exact shift: |x| / 2^k <= 448 or rounds to 0 below 2^-10
}

}  // namespace moe::fp8

// The E4M3 scalar conversion and the power-of-two tile scales (moe/core/fp8.h) against the format's
// definition: decoding from the bit fields, encoding by a brute-force nearest-value search.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "moe/core/fp8.h"
#include "moe/core/rng.h"

namespace moe {
namespace {

float from_bits(uint32_t u) { return fp8::bits_float(u); }
uint32_t to_bits(float f) { return fp8::float_bits(f); }

// E4M3 by its definition: sign, exponent e (bias 7), mantissa m; e = 0 is subnormal (m/8 * 2^-6);
// e = 15 with m = 7 is NaN; no infinities.
double e4m3_definition(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const double sign = (c & 0x80) ? -1.0 : 1.0;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(m / 8.0, -6);
  return sign * std::ldexp(1.0 + m / 8.0, e - 7);
}

// The nearest of the 127 non-negative finite codes to |x| (ties to the even code, whose mantissa
// ends in 0), |x| > 448 saturating to 448, NaN to 0x7f; the sign bit copied from x.
uint8_t e4m3_brute_force(float x) {
  const uint8_t sign = (to_bits(x) >> 31) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7f;
  const double a = std::fabs(static_cast<double>(x));
  if (a > 448.0) return sign | 0x7e;
  int best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(e4m3_definition(static_cast<uint8_t>(c)) - a);
    if (d < best_distance || (d == best_distance && (c & 1) == 0)) {
      best = c;
      best_distance = d;
    }
  }
  return sign | static_cast<uint8_t>(best);
}

void add_with_neighbours(std::vector<float>& samples, float v) {
  samples.push_back(v);
  samples.push_back(std::nextafter(v, std::numeric_limits<float>::infinity()));
  samples.push_back(std::nextafter(v, -std::numeric_limits<float>::infinity()));
}

// Every E4M3 value, every midpoint between neighbours (also 0 | 2^-9 and 448 | the would-be 480),
// each with its FP32 neighbours, both signs; FP32 subnormals, extremes, infinities, NaNs; random
// bit patterns and a stride over all 2^32 patterns.
std::vector<float> encode_samples() {
  std::vector<float> samples;
  std::vector<double> values;
  for (int c = 0; c <= 0x7e; ++c) values.push_back(e4m3_definition(static_cast<uint8_t>(c)));
  values.push_back(480.0);
  for (size_t i = 0; i < values.size(); ++i) {
    for (float sign : {1.0f, -1.0f}) {
      add_with_neighbours(samples, sign * static_cast<float>(values[i]));
      if (i + 1 < values.size())
        add_with_neighbours(samples, sign * static_cast<float>((values[i] + values[i + 1]) / 2));
    }
  }
  for (uint32_t bits : {0x00000001u, 0x00000002u, 0x00400000u, 0x007fffffu, 0x00800000u, 0x7f7fffffu, 0x7f800000u,
                        0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0x3a800000u, 0x3a000000u})
    for (uint32_t sign : {0u, 0x80000000u}) samples.push_back(from_bits(bits | sign));
  Rng rng(7);
  for (int i = 0; i < (1 << 18); ++i) samples.push_back(from_bits(static_cast<uint32_t>(rng.next_u64())));
  // Random values in and just around the E4M3 range, where the rounding happens.
  for (int i = 0; i < (1 << 18); ++i)
    samples.push_back(
        static_cast<float>((rng.uniform() * 2 - 1) * std::ldexp(1.0, static_cast<int>(rng.below(26)) - 16)));
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 65537)
    samples.push_back(from_bits(static_cast<uint32_t>(bits)));
  return samples;
}

TEST(Fp8Scalar, every_code_decodes_to_its_e4m3_definition) {
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_definition(static_cast<uint8_t>(c));
    const float got = fp8::e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;  // 0x80 is -0
  }
  EXPECT_EQ(fp8::e4m3_to_f32(fp8::kE4m3MaxCode), fp8::kE4m3Max);
  EXPECT_EQ(fp8::e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(Fp8Scalar, encoding_is_the_nearest_value_ties_to_even_saturating_at_448_nan_kept) {
  int64_t mismatches = 0;
  for (float x : encode_samples()) {
    const uint8_t want = e4m3_brute_force(x), got = fp8::e4m3_from_f32(x);
    if (got != want && ++mismatches <= 10)
      ADD_FAILURE() << "x = " << x << " (bits 0x" << std::hex << to_bits(x) << "): got 0x" << int(got)
                    << ", nearest is 0x" << int(want) << std::dec;
  }
  EXPECT_EQ(mismatches, 0);
  // The cases the rule above names, spelled out.
  EXPECT_EQ(fp8::e4m3_from_f32(464.0f), 0x7e);                                 // tie 448 | 480: saturates
  EXPECT_EQ(fp8::e4m3_from_f32(std::numeric_limits<float>::infinity()), 0x7e);  // infinity saturates
  EXPECT_EQ(fp8::e4m3_from_f32(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(fp8::e4m3_from_f32(std::ldexp(1.0f, -10)), 0x00);        // tie 0 | 2^-9: to even (0)
  EXPECT_EQ(fp8::e4m3_from_f32(std::ldexp(3.0f, -10)), 0x02);        // tie 2^-9 | 2^-8: to even (2)
  EXPECT_EQ(fp8::e4m3_from_f32(1.0625f), 0x38);                      // tie 1 | 1.125: to even (1)
  EXPECT_EQ(fp8::e4m3_from_f32(1.1875f), 0x3a);                      // tie 1.125 | 1.25: to even (1.25)
  EXPECT_EQ(fp8::e4m3_from_f32(-std::numeric_limits<float>::quiet_NaN()), 0xff);
}

TEST(Fp8Scalar, every_finite_code_round_trips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(fp8::e4m3_from_f32(fp8::e4m3_to_f32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}

// k is the smallest exponent (not below -126) with amax <= 448 * 2^k.
void expect_smallest_exponent(float amax) {
  const int k = fp8::scale_exponent(amax);
  if (amax == 0.0f) {
    EXPECT_EQ(k, 0);
    return;
  }
  ASSERT_GE(k, fp8::kMinScaleExponent) << amax;
  EXPECT_LE(static_cast<double>(amax), 448.0 * std::ldexp(1.0, k)) << "amax " << amax << " k " << k;
  if (k > fp8::kMinScaleExponent) {
    EXPECT_GT(static_cast<double>(amax), 448.0 * std::ldexp(1.0, k - 1)) << "amax " << amax << " k " << k;
  }
  EXPECT_EQ(fp8::tile_scale(amax), std::ldexp(1.0f, k)) << amax;
}

TEST(Fp8Scalar, scale_exponent_is_the_smallest_power_of_two_fitting_448) {
  std::vector<float> amaxes = {0.0f, FLT_MAX, FLT_MIN, from_bits(1), from_bits(0x007fffff), 448.0f, 464.0f, 1.0f};
  for (int e = -149; e <= 127; ++e)  // 448 * 2^e and its neighbours, wherever it is a finite float
    for (double m : {1.0, 1.75, 1.5, 1.875}) {
      const double v = std::ldexp(m, e);
      if (v < FLT_MAX) add_with_neighbours(amaxes, static_cast<float>(v));
    }
  Rng rng(11);
  for (int i = 0; i < (1 << 16); ++i) amaxes.push_back(std::fabs(from_bits(static_cast<uint32_t>(rng.next_u64()))));
  for (float amax : amaxes) {
    if (std::isfinite(amax)) expect_smallest_exponent(std::fabs(amax));
  }
}

TEST(Fp8Scalar, a_nan_or_infinite_amax_gives_a_nan_scale_and_nan_codes) {
  for (float amax : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const float scale = fp8::tile_scale(amax);
    EXPECT_TRUE(std::isnan(scale));
    EXPECT_EQ(fp8::quantize_with_scale(1.0f, scale), fp8::kE4m3NanCode);
    EXPECT_EQ(fp8::quantize_with_scale(0.0f, scale), fp8::kE4m3NanCode);
  }
}

TEST(Fp8Scalar, quantize_with_scale_rounds_x_over_the_scale) {
  Rng rng(5);
  for (int i = 0; i < 4096; ++i) {
    const float x = static_cast<float>(rng.normal() * std::ldexp(1.0, static_cast<int>(rng.below(60)) - 30));
    const float scale = fp8::tile_scale(std::fabs(x) * static_cast<float>(1 + rng.below(1000)));
    EXPECT_EQ(fp8::quantize_with_scale(x, scale), e4m3_brute_force(static_cast<float>(x / static_cast<double>(scale))))
        << x << " / " << scale;
  }
}

}  // namespace
}  // namespace moe

// Element types and devices. CPU compute is FP32; BF16 on the CPU is storage only.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace moe {

enum class DType : uint8_t { F32, BF16, FP8_E4M3, E8M0, I32, I64, U8 };
enum class Device : uint8_t { CPU, CUDA };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::FP8_E4M3: return 1;
    case DType::E8M0: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

// Names as safetensors spells them.
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::FP8_E4M3: return "F8_E4M3";
    case DType::E8M0: return "F8_E8M0";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  return "?";
}

constexpr std::string_view device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

// BF16 <-> FP32 with round-to-nearest-even on store (NaN stays NaN).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace moe

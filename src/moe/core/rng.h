// Deterministic random numbers. Everything random in a run (initialization, data sampling,
// random routing) is a pure function of (seed, purpose, counters), so a resumed run draws
// exactly what the uninterrupted run would have drawn without saving generator state.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

// mix64 and hash_counters also compile as device functions, so a kernel draws exactly the
// numbers the host draws (random routing on the GPU); Rng itself stays host-only.
#if defined(__CUDACC__)
#define MOE_HOST_DEVICE __host__ __device__
#else
#define MOE_HOST_DEVICE
#endif

namespace moe {

// SplitMix64 finalizer: a good 64-bit mixing function.
MOE_HOST_DEVICE constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Hash of several counters, order-sensitive.
MOE_HOST_DEVICE constexpr uint64_t hash_counters(uint64_t a, uint64_t b = 0, uint64_t c = 0, uint64_t d = 0) {
  return mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ d);
}

// FNV-1a of a string: a stable hash (unlike std::hash) for keying random streams by name.
constexpr uint64_t hash_string(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

class Rng {
 public:
  explicit Rng(uint64_t seed, uint64_t stream = 0) : state_(hash_counters(seed, stream)) {}
  uint64_t next_u64() {
    state_ += 0x9e3779b97f4a7c15ull;
    return mix64(state_);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next_u64() % n; }
  // Standard normal (Box-Muller).
  double normal() {
    double u1 = uniform();
    const double u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

}  // namespace moe

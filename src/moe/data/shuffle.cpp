#include "moe/data/shuffle.h"

#include "moe/core/error.h"
#include "moe/core/rng.h"

namespace moe {

namespace {
constexpr int kRounds = 4;
constexpr uint64_t kShufflePurpose = 0x5348'5546'464c'4500ull;  // "SHUFFLE"
}  // namespace

Shuffle::Shuffle(uint64_t n, uint64_t seed, uint64_t stream) : n_(n), seed_(seed), stream_(stream) {
  MOE_CHECK(n >= 1 && n < (uint64_t{1} << 62), "Shuffle: n must be in [1, 2^62), got ", n);
  int bits = 2;
  while ((uint64_t{1} << bits) < n) bits += 2;
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
}

uint64_t Shuffle::encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t f = hash_counters(seed_, kShufflePurpose ^ stream_, static_cast<uint64_t>(r), right) & half_mask_;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t Shuffle::operator()(uint64_t i) const {
  MOE_CHECK(i < n_, "Shuffle: index ", i, " outside [0, ", n_, ")");
  uint64_t x = encrypt(i);
  while (x >= n_) x = encrypt(x);  // cycle walking: stays inside [0, 2^b), ends in [0, n)
  return x;
}

}  // namespace moe

// A seeded random permutation of [0, n) evaluated one index at a time, with O(1) memory: the
// epoch order of billions of training instances without materializing an index array.
//
// NOTES: a 4-round Feistel network over the smallest even number of bits that covers n is a
// bijection of [0, 2^b); "cycle walking" (apply it again while the value is >= n) restricts it
// to a bijection of [0, n). Since 2^b < 4n the expected number of walks is below 4. The round
// function is the project's counter-based hash (core/rng.h), so the order is a pure function of
// (seed, stream, n): the same on every rank, every topology and every resume. No library in the
// project's dependencies offers a random-access permutation, hence these few lines.
#pragma once

#include <cstdint>

namespace moe {

class Shuffle {
 public:
  // A permutation of [0, n) chosen by (seed, stream); n >= 1.
  Shuffle(uint64_t n, uint64_t seed, uint64_t stream);
  uint64_t operator()(uint64_t i) const;  // i in [0, n)
  uint64_t size() const { return n_; }

 private:
  uint64_t encrypt(uint64_t x) const;
  uint64_t n_;
  uint64_t seed_, stream_;
  int half_bits_;
  uint64_t half_mask_;
};

}  // namespace moe

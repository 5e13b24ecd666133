// Checksums of checkpoint chunks: XXH3-64 from xxHash, which hashes at close to memory bandwidth,
// so multi-GB checkpoints are hashed once on save and verified on load at a small fraction of the
// time their IO takes (bench numbers in docs/architecture.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moe {

// The name index.json records next to every checksum.
inline constexpr std::string_view kChecksumAlgorithm = "xxh3-64";

// XXH3-64 (seed 0) of n bytes.
uint64_t checksum_bytes(const void* bytes, size_t n);

// 16 lowercase hexadecimal digits, zero-padded.
std::string checksum_hex(uint64_t checksum);
// The value of exactly 16 hexadecimal digits, or nothing for any other text.
std::optional<uint64_t> checksum_from_hex(std::string_view hex);

}  // namespace moe

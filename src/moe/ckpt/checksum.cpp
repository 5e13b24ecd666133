#include "moe/ckpt/checksum.h"

#include <xxhash.h>

#include <charconv>
#include <cstdio>

namespace moe {

uint64_t checksum_bytes(const void* bytes, size_t n) {
  static const unsigned char kNoBytes = 0;  // empty slices may have no data pointer
  return XXH3_64bits(n ? bytes : &kNoBytes, n);
}

std::string checksum_hex(uint64_t checksum) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(checksum));
  return buf;
}

std::optional<uint64_t> checksum_from_hex(std::string_view hex) {
  if (hex.size() != 16) return std::nullopt;
  for (char ch : hex)
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F'))) return std::nullopt;
  uint64_t value = 0;
  std::from_chars(hex.data(), hex.data() + hex.size(), value, 16);
  return value;
}

}  // namespace moe

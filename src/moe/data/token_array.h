// A read-only memory map of one token file: a .npy file (header validated, data_offset past it)
// or a raw headerless array of uint16 / uint32 tokens (OLMo-core and Dolma tokenized files,
// whose size must be a multiple of the token size). Every failure is a moe::Error naming the file.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "moe/data/npy.h"

namespace moe {

class TokenArray {
 public:
  static TokenArray open_npy(const std::string& path);
  static TokenArray open_raw(const std::string& path, TokenDType dtype);
  // format "npy" or "raw" (data.format); dtype is used for raw files only.
  static TokenArray open(const std::string& path, const std::string& format, TokenDType dtype);

  TokenArray() = default;
  TokenArray(TokenArray&& o) noexcept { swap(o); }
  TokenArray& operator=(TokenArray&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  TokenArray(const TokenArray&) = delete;
  TokenArray& operator=(const TokenArray&) = delete;
  ~TokenArray() { release(); }

  const std::string& path() const { return path_; }
  TokenDType dtype() const { return dtype_; }
  int64_t size() const { return length_; }
  // Pointer to the first element (may be unaligned in files from odd writers: read via at()).
  const unsigned char* bytes() const { return map_ + data_offset_; }
  uint32_t at(int64_t i) const {
    if (dtype_ == TokenDType::U16) {
      uint16_t v;
      std::memcpy(&v, bytes() + 2 * i, 2);
      return v;
    }
    uint32_t v;
    std::memcpy(&v, bytes() + 4 * i, 4);
    return v;
  }

 private:
  void map(const std::string& path, size_t bytes);
  void release();
  void swap(TokenArray& o) noexcept;

  std::string path_;
  TokenDType dtype_ = TokenDType::U16;
  int64_t length_ = 0;
  int64_t data_offset_ = 0;
  const unsigned char* map_ = nullptr;
  size_t map_bytes_ = 0;
};

// "uint16" / "uint32" (data.dtype) -> TokenDType.
TokenDType token_dtype_from_name(const std::string& name);

}  // namespace moe

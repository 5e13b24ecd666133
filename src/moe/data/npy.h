// .npy token files: 1-D little-endian uint16 or uint32 arrays (NumPy format 1.0, 2.0, 3.0).
// Reading memory-maps the file read-only after validating the header and the file size;
// every failure is a moe::Error that names the file.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace moe {

enum class TokenDType : uint8_t { U16, U32 };

constexpr size_t token_dtype_size(TokenDType t) { return t == TokenDType::U16 ? 2 : 4; }
constexpr const char* token_dtype_name(TokenDType t) { return t == TokenDType::U16 ? "uint16" : "uint32"; }

// Header facts of a .npy token file.
struct NpyHeader {
  TokenDType dtype = TokenDType::U16;
  int64_t length = 0;       // number of elements (shape (length,))
  int64_t data_offset = 0;  // bytes before the first element
};

// Parses and validates the header of `path` (magic, version, dict with descr '<u2' or '<u4',
// fortran_order False, 1-D shape) and checks the file size equals data_offset + length *
// itemsize. Throws moe::Error naming the file on any problem.
NpyHeader read_npy_header(const std::string& path);

// A read-only memory map of a validated 1-D token .npy file. Move-only.
class NpyTokens {
 public:
  static NpyTokens open(const std::string& path);
  NpyTokens() = default;
  NpyTokens(NpyTokens&& o) noexcept { swap(o); }
  NpyTokens& operator=(NpyTokens&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  NpyTokens(const NpyTokens&) = delete;
  NpyTokens& operator=(const NpyTokens&) = delete;
  ~NpyTokens() { release(); }

  const std::string& path() const { return path_; }
  TokenDType dtype() const { return header_.dtype; }
  int64_t size() const { return header_.length; }
  // Pointer to the first element (may be unaligned in files from odd writers: read via at()).
  const unsigned char* bytes() const { return map_ + header_.data_offset; }
  uint32_t at(int64_t i) const {
    if (header_.dtype == TokenDType::U16) {
      uint16_t v;
      std::memcpy(&v, bytes() + 2 * i, 2);
      return v;
    }
    uint32_t v;
    std::memcpy(&v, bytes() + 4 * i, 4);
    return v;
  }

 private:
  void release();
  void swap(NpyTokens& o) noexcept;

  std::string path_;
  NpyHeader header_;
  const unsigned char* map_ = nullptr;
  size_t map_bytes_ = 0;
};

// Writes a 1-D .npy file (format 1.0, header padded to 64 bytes). Throws naming the file.
void write_npy(const std::string& path, std::span<const uint16_t> values);
void write_npy(const std::string& path, std::span<const uint32_t> values);
// A float32 array of any shape (for dumping logits to compare with other implementations).
void write_npy_f32(const std::string& path, std::span<const float> values, const std::vector<int64_t>& shape);

}  // namespace moe

// .npy token files: 1-D little-endian uint16 or uint32 arrays (NumPy format 1.0, 2.0, 3.0): the
// header's validation and the writers. Reading the tokens is TokenArray (token_array.h).
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

// Every .npy file starts with these 6 bytes.
inline constexpr char kNpyMagic[] = "\x93NUMPY";
inline constexpr size_t kNpyMagicLen = 6;

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

// Writes a 1-D .npy file (format 1.0, header padded to 64 bytes). Throws naming the file.
void write_npy(const std::string& path, std::span<const uint16_t> values);
void write_npy(const std::string& path, std::span<const uint32_t> values);
// The same, written at `path` itself (it must not exist; a failed write removes it), for a caller
// that writes under a temporary name of its own and renames it (prepare): write_npy would add a
// second temporary name that the caller does not know of.
void write_new_npy(const std::string& path, std::span<const uint16_t> values);
// A float32 array of any shape (for dumping logits to compare with other implementations). It never
// replaces anything at `path`: an entry that appeared there while the caller ran (or a symbolic
// link) is an error naming it.
void write_npy_f32(const std::string& path, std::span<const float> values, const std::vector<int64_t>& shape);

}  // namespace moe

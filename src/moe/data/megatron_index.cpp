#include "moe/data/megatron_index.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "moe/core/error.h"
#include "moe/core/printable.h"

namespace moe {

namespace {

constexpr char kMagic[] = "MMIDIDX\0\0";
constexpr size_t kMagicLen = kMegatronIndexMagicLen;
// Magic, version (u64), token type code (u8), sequence count (u64), document count (u64).
constexpr uint64_t kHeaderBytes = kMagicLen + 8 + 1 + 8 + 8;

// Megatron's token type codes (megatron/core/datasets/indexed_dataset.py, DType): the name, and
// the TokenDType that reads it (`readable` false for the types moetrain does not read).
struct MegatronType {
  const char* name;
  bool readable;
  TokenDType dtype;
};
MegatronType megatron_type(uint8_t code) {
  switch (code) {
    case 1: return {"uint8", false, TokenDType::U16};
    case 2: return {"int8", false, TokenDType::U16};
    case 3: return {"int16", false, TokenDType::U16};
    case 4: return {"int32", true, TokenDType::U32};
    case 5: return {"int64", false, TokenDType::U16};
    case 6: return {"float64", false, TokenDType::U16};
    case 7: return {"float32", false, TokenDType::U16};
    case 8: return {"uint16", true, TokenDType::U16};
    case 9: return {"uint32", true, TokenDType::U32};
    default: return {nullptr, false, TokenDType::U16};
  }
}

template <typename T>
T read_at(std::ifstream& in, uint64_t offset, const std::string& idx) {
  T v{};
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(reinterpret_cast<char*>(&v), sizeof v);
  MOE_CHECK(in.good(), "Megatron index ", idx, " is cut short (no bytes at offset ", offset, ")");
  return v;
}

}  // namespace

bool is_megatron_index(const char* bytes, size_t n) {
  return n >= kMagicLen && std::memcmp(bytes, kMagic, kMagicLen) == 0;
}

void check_megatron_index(const std::string& bin_path, TokenDType dtype, uint64_t bin_bytes) {
  namespace fs = std::filesystem;
  if (fs::path(bin_path).extension() != ".bin") return;
  const std::string idx = fs::path(bin_path).replace_extension(".idx").string();
  std::ifstream in(idx, std::ios::binary);
  if (!in) return;  // none (or unreadable: then nothing to check the tokens against)
  char magic[kMagicLen] = {};
  in.read(magic, kMagicLen);
  if (!in || !is_megatron_index(magic, kMagicLen)) return;  // another program's .idx
  const std::string pair = printable(bin_path) + " (with its Megatron index " + printable(idx) + ")";
  const auto version = read_at<uint64_t>(in, kMagicLen, idx);
  MOE_CHECK(version == 1, "raw token file ", pair, ": index version ", version, ", of which moetrain knows 1 only");
  const auto code = read_at<uint8_t>(in, kMagicLen + 8, idx);
  const auto sequences = read_at<uint64_t>(in, kMagicLen + 9, idx);
  const MegatronType type = megatron_type(code);
  MOE_CHECK(type.name != nullptr, "raw token file ", pair, ": unknown token type code ", static_cast<int>(code),
            " in the index");
  MOE_CHECK(type.readable, "raw token file ", pair, " holds ", type.name,
            " tokens, which moetrain does not read (uint16, or int32/uint32 as uint32)");
  MOE_CHECK(type.dtype == dtype, "raw token file ", pair, " holds ", type.name, " tokens, but data.dtype = \"",
            token_dtype_name(dtype), "\" would read them as ", token_dtype_size(dtype),
            "-byte tokens: set data.dtype = \"", token_dtype_name(type.dtype), "\"");
  const auto boundaries = read_at<uint64_t>(in, kMagicLen + 17, idx);  // documents + 1
  MOE_CHECK(sequences <= (uint64_t{1} << 40) && boundaries <= (uint64_t{1} << 40), "Megatron index ", idx, " claims ",
            sequences, " sequences and ", boundaries, " document boundaries");
  // Lengths (int32) and offsets (int64) per sequence, then the document boundaries (int64).
  const uint64_t needed = kHeaderBytes + 12 * sequences + 8 * boundaries;
  std::error_code ec;
  const uint64_t held = fs::file_size(idx, ec);
  MOE_CHECK(!ec && held >= needed, "raw token file ", pair, ": the index is cut short (", sequences, " sequences and ",
            boundaries, " document boundaries need ", needed, " bytes, it holds ", held,
            "): the pair is incomplete; write it again");
  // The last sequence's length (int32) and byte offset (int64): where the tokens end.
  uint64_t end = 0;
  if (sequences > 0) {
    const auto length = read_at<int32_t>(in, kHeaderBytes + 4 * (sequences - 1), idx);
    const auto offset = read_at<int64_t>(in, kHeaderBytes + 4 * sequences + 8 * (sequences - 1), idx);
    MOE_CHECK(length >= 0 && offset >= 0, "Megatron index ", idx, " holds a negative length or offset");
    end = static_cast<uint64_t>(offset) + static_cast<uint64_t>(length) * token_dtype_size(dtype);
  }
  MOE_CHECK(end == bin_bytes, "raw token file ", pair, ": the index says its ", sequences, " sequences end at byte ",
            end, ", but the .bin holds ", bin_bytes, " bytes: the pair is incomplete or from different writes");
}

std::vector<int64_t> megatron_document_ends(const std::string& bin_path, TokenDType dtype, size_t at_most) {
  namespace fs = std::filesystem;
  std::vector<int64_t> ends;
  if (fs::path(bin_path).extension() != ".bin" || at_most == 0) return ends;
  const std::string idx = fs::path(bin_path).replace_extension(".idx").string();
  std::ifstream in(idx, std::ios::binary);
  char magic[kMagicLen] = {};
  in.read(magic, kMagicLen);
  if (!in || !is_megatron_index(magic, kMagicLen)) return ends;
  const auto sequences = read_at<uint64_t>(in, kMagicLen + 9, idx);
  const auto boundaries = read_at<uint64_t>(in, kMagicLen + 17, idx);  // documents + 1 sequence indices
  MOE_CHECK(sequences <= (uint64_t{1} << 40) && boundaries <= (uint64_t{1} << 40), "Megatron index ", idx, " claims ",
            sequences, " sequences and ", boundaries, " document boundaries");
  if (boundaries < 2) return ends;
  const uint64_t documents = boundaries - 1;
  const uint64_t lengths_at = kHeaderBytes, pointers_at = lengths_at + 4 * sequences,
                 documents_at = pointers_at + 8 * sequences;
  const uint64_t picks = std::min<uint64_t>(at_most, documents);
  for (uint64_t k = 0; k < picks; ++k) {
    const uint64_t d = k * documents / picks;
    // The document's last sequence: the one before the next document's first.
    const auto next_first = read_at<int64_t>(in, documents_at + 8 * (d + 1), idx);
    if (next_first <= 0 || static_cast<uint64_t>(next_first) > sequences) continue;  // an empty or odd document
    const uint64_t s = static_cast<uint64_t>(next_first) - 1;
    const auto length = read_at<int32_t>(in, lengths_at + 4 * s, idx);
    const auto offset = read_at<int64_t>(in, pointers_at + 8 * s, idx);
    if (length <= 0 || offset < 0) continue;
    ends.push_back(offset / static_cast<int64_t>(token_dtype_size(dtype)) + length - 1);
  }
  return ends;
}

}  // namespace moe

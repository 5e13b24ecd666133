#include "moe/data/megatron_index.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

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

namespace {

// A Megatron index opened and its header read: the token type code, the sequence count and the
// count of document boundaries (documents + 1), then where its three arrays begin.
struct IndexHeader {
  std::string idx;
  std::ifstream in;
  uint8_t code = 0;
  uint64_t sequences = 0, boundaries = 0;
  uint64_t lengths_at() const { return kHeaderBytes; }                     // int32 per sequence
  uint64_t offsets_at() const { return lengths_at() + 4 * sequences; }     // int64 per sequence
  uint64_t boundaries_at() const { return offsets_at() + 8 * sequences; }  // int64 per boundary
  uint64_t bytes_needed() const { return boundaries_at() + 8 * boundaries; }
};

// The index beside `bin_path` (<prefix>.idx for <prefix>.bin), or nullopt when there is none (or
// it is another program's). Throws on a version or counts no Megatron index has.
std::optional<IndexHeader> open_index(const std::string& bin_path) {
  namespace fs = std::filesystem;
  if (fs::path(bin_path).extension() != ".bin") return std::nullopt;
  IndexHeader h;
  h.idx = fs::path(bin_path).replace_extension(".idx").string();
  h.in.open(h.idx, std::ios::binary);
  if (!h.in) return std::nullopt;  // none (or unreadable: then nothing to check the tokens against)
  char magic[kMagicLen] = {};
  h.in.read(magic, kMagicLen);
  const auto got = static_cast<size_t>(h.in.gcount());
  // Shorter than the magic but the start of it (empty too): a Megatron index whose writing or copy
  // was cut short, not another program's. Reading on without it would skip the type check.
  MOE_CHECK(got >= kMagicLen || std::memcmp(magic, kMagic, got) != 0, "raw token file ", printable(bin_path),
            ": its Megatron index ", printable(h.idx), " is cut short (", got,
            " bytes, not even its header): the pair is incomplete; write it again");
  if (!is_megatron_index(magic, got)) return std::nullopt;  // another program's .idx
  const auto version = read_at<uint64_t>(h.in, kMagicLen, h.idx);
  MOE_CHECK(version == 1, "Megatron index ", printable(h.idx), ": version ", version,
            ", of which moetrain knows 1 only");
  h.code = read_at<uint8_t>(h.in, kMagicLen + 8, h.idx);
  h.sequences = read_at<uint64_t>(h.in, kMagicLen + 9, h.idx);
  h.boundaries = read_at<uint64_t>(h.in, kMagicLen + 17, h.idx);
  MOE_CHECK(h.sequences <= (uint64_t{1} << 40) && h.boundaries <= (uint64_t{1} << 40), "Megatron index ", h.idx,
            " claims ", h.sequences, " sequences and ", h.boundaries, " document boundaries");
  return h;
}

}  // namespace

void check_megatron_index(const std::string& bin_path, TokenDType dtype, uint64_t bin_bytes) {
  std::optional<IndexHeader> h = open_index(bin_path);
  if (!h) return;
  const std::string& idx = h->idx;
  const std::string pair = printable(bin_path) + " (with its Megatron index " + printable(idx) + ")";
  const MegatronType type = megatron_type(h->code);
  MOE_CHECK(type.name != nullptr, "raw token file ", pair, ": unknown token type code ", static_cast<int>(h->code),
            " in the index");
  MOE_CHECK(type.readable, "raw token file ", pair, " holds ", type.name,
            " tokens, which moetrain does not read (uint16, or int32/uint32 as uint32)");
  MOE_CHECK(type.dtype == dtype, "raw token file ", pair, " holds ", type.name, " tokens, but data.dtype = \"",
            token_dtype_name(dtype), "\" would read them as ", token_dtype_size(dtype),
            "-byte tokens: set data.dtype = \"", token_dtype_name(type.dtype), "\"");
  std::error_code ec;
  const uint64_t held = std::filesystem::file_size(idx, ec);
  MOE_CHECK(!ec && held >= h->bytes_needed(), "raw token file ", pair, ": the index is cut short (", h->sequences,
            " sequences and ", h->boundaries, " document boundaries need ", h->bytes_needed(), " bytes, it holds ",
            held, "): the pair is incomplete; write it again");
  // The last sequence's length and byte offset: where the tokens end.
  uint64_t end = 0;
  if (h->sequences > 0) {
    const uint64_t last = h->sequences - 1;
    const auto length = read_at<int32_t>(h->in, h->lengths_at() + 4 * last, idx);
    const auto offset = read_at<int64_t>(h->in, h->offsets_at() + 8 * last, idx);
    MOE_CHECK(length >= 0 && offset >= 0, "Megatron index ", idx, " holds a negative length or offset");
    end = static_cast<uint64_t>(offset) + static_cast<uint64_t>(length) * token_dtype_size(dtype);
  }
  MOE_CHECK(end == bin_bytes, "raw token file ", pair, ": the index says its ", h->sequences, " sequences end at byte ",
            end, ", but the .bin holds ", bin_bytes, " bytes: the pair is incomplete or from different writes");
}

std::vector<int64_t> megatron_document_ends(const std::string& bin_path, TokenDType dtype, size_t at_most) {
  std::vector<int64_t> ends;
  std::optional<IndexHeader> h = at_most > 0 ? open_index(bin_path) : std::nullopt;
  if (!h || h->boundaries < 2) return ends;
  const uint64_t documents = h->boundaries - 1;
  const uint64_t picks = std::min<uint64_t>(at_most, documents);
  for (uint64_t k = 0; k < picks; ++k) {
    const uint64_t d = k * documents / picks;
    // The document's last sequence: the one before the next document's first.
    const auto next_first = read_at<int64_t>(h->in, h->boundaries_at() + 8 * (d + 1), h->idx);
    if (next_first <= 0 || static_cast<uint64_t>(next_first) > h->sequences) continue;  // an empty or odd document
    const uint64_t s = static_cast<uint64_t>(next_first) - 1;
    const auto length = read_at<int32_t>(h->in, h->lengths_at() + 4 * s, h->idx);
    const auto offset = read_at<int64_t>(h->in, h->offsets_at() + 8 * s, h->idx);
    if (length <= 0 || offset < 0) continue;
    ends.push_back(offset / static_cast<int64_t>(token_dtype_size(dtype)) + length - 1);
  }
  return ends;
}

}  // namespace moe

// Megatron-LM's indexed datasets (preprocess_data.py) are pairs: <prefix>.bin, every document's
// token ids back to back without a header (what data.format = "raw" reads), and <prefix>.idx,
// their index (a header, then per-sequence lengths and byte offsets, then document boundaries).
// moetrain reads the tokens; the index is checked so that a .bin read with the wrong token size
// (Megatron writes uint16 below a 65500-token vocabulary, int32 above) or cut short is an error
// naming the pair instead of training on garbage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/data/npy.h"

namespace moe {

inline constexpr size_t kMegatronIndexMagicLen = 9;  // "MMIDIDX\0\0"
// Whether `bytes` (the first `n` of a file) start a Megatron index.
bool is_megatron_index(const char* bytes, size_t n);

// For a raw token file `bin_path` ending in ".bin" with a Megatron index beside it (<prefix>.idx
// starting with "MMIDIDX\0\0"): checks that the index's token type is data.dtype's (int32 ids
// read as uint32) and that its last sequence ends at the .bin's size (`bin_bytes`). Throws naming
// both files and the fix; returns when there is no such index.
void check_megatron_index(const std::string& bin_path, TokenDType dtype, uint64_t bin_bytes);

// The token index of the last token of up to `at_most` documents of a Megatron .bin (spread
// evenly over them), from its index; empty when there is no index. Call after check_megatron_index.
std::vector<int64_t> megatron_document_ends(const std::string& bin_path, TokenDType dtype, size_t at_most);

}  // namespace moe

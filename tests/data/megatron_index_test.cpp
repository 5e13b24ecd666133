// Megatron-LM indexed datasets (<prefix>.bin + <prefix>.idx) under data.format = "raw": the .bin's
// tokens are read as they are; the index beside it is checked, so a token type other than
// data.dtype's, a type moetrain does not read, or a .bin that does not end where the index says is
// an error naming the pair and the fix (before, a uint16 .bin read as uint32 trained on pairs of
// tokens glued together). A .bin without an index, or beside another program's .idx, reads as before.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "moe/core/error.h"
#include "moe/data/megatron_index.h"
#include "moe/data/token_array.h"
#include "moe/data/token_sources.h"
#include "../ckpt/temp_dir.h"
#include "../error_of.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

using moe::testing::error_of;

template <typename T>
void put(std::ofstream& out, T v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof v);
}

// Writes <prefix>.bin and <prefix>.idx as Megatron's IndexedDatasetBuilder lays them out: one
// sequence per document, token type `code` (4 int32, 8 uint16, 7 float32) of `item` bytes.
template <typename Token>
void write_pair(const std::string& prefix, const std::vector<std::vector<Token>>& docs, uint8_t code) {
  std::ofstream bin(prefix + ".bin", std::ios::binary), idx(prefix + ".idx", std::ios::binary);
  for (const auto& d : docs) bin.write(reinterpret_cast<const char*>(d.data()), d.size() * sizeof(Token));
  idx.write("MMIDIDX\0\0", 9);
  put<uint64_t>(idx, 1);
  put<uint8_t>(idx, code);
  put<uint64_t>(idx, docs.size());
  put<uint64_t>(idx, docs.size() + 1);
  for (const auto& d : docs) put<int32_t>(idx, static_cast<int32_t>(d.size()));
  int64_t offset = 0;
  for (const auto& d : docs) put<int64_t>(idx, offset), offset += static_cast<int64_t>(d.size() * sizeof(Token));
  for (size_t i = 0; i <= docs.size(); ++i) put<int64_t>(idx, static_cast<int64_t>(i));
}

const std::vector<std::vector<uint16_t>> kDocs16 = {{5, 6, 7, 65000}, {9, 10, 11}};  // 7 tokens: an odd count
const std::vector<std::vector<int32_t>> kDocs32 = {{70000, 1, 2}, {3, 100000}};

void expect_contains(const std::string& message, const std::vector<std::string>& parts) {
  ASSERT_FALSE(message.empty()) << "no error";
  for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
}

TEST(MegatronIndex, APairOfTheRightTypeReadsItsTokensAsTheyAre) {
  moe::testing::TempDir dir;
  write_pair(dir.path + "/a_text_document", kDocs16, 8);
  const TokenArray t = TokenArray::open(dir.path + "/a_text_document.bin", "raw", TokenDType::U16);
  std::vector<uint32_t> got, want;
  for (int64_t i = 0; i < t.size(); ++i) got.push_back(t.at(i));
  for (const auto& d : kDocs16) want.insert(want.end(), d.begin(), d.end());
  EXPECT_EQ(got, want);
  write_pair(dir.path + "/b_text_document", kDocs32, 4);  // int32 ids read as uint32
  EXPECT_EQ(TokenArray::open(dir.path + "/b_text_document.bin", "raw", TokenDType::U32).at(0), 70000u);
}

TEST(MegatronIndex, AnotherTokenTypeThanDataDtypeIsRefusedNamingThePairAndTheFix) {
  moe::testing::TempDir dir;
  write_pair(dir.path + "/a", kDocs16, 8);
  expect_contains(error_of([&] { TokenArray::open(dir.path + "/a.bin", "raw", TokenDType::U32); }),
                  {dir.path + "/a.bin", dir.path + "/a.idx", "uint16 tokens", "set data.dtype = \"uint16\""});
  write_pair(dir.path + "/b", kDocs32, 4);
  expect_contains(error_of([&] { TokenArray::open(dir.path + "/b.bin", "raw", TokenDType::U16); }),
                  {dir.path + "/b.idx", "int32 tokens", "set data.dtype = \"uint32\""});
  write_pair(dir.path + "/c", std::vector<std::vector<float>>{{1.0f, 2.0f}}, 7);
  expect_contains(error_of([&] { TokenArray::open(dir.path + "/c.bin", "raw", TokenDType::U32); }),
                  {dir.path + "/c.idx", "float32 tokens, which moetrain does not read"});
}

TEST(MegatronIndex, ABinThatDoesNotEndWhereItsIndexSaysIsRefused) {
  moe::testing::TempDir dir;
  write_pair(dir.path + "/a", kDocs32, 4);
  fs::resize_file(dir.path + "/a.bin", fs::file_size(dir.path + "/a.bin") - 4);
  expect_contains(error_of([&] { TokenArray::open(dir.path + "/a.bin", "raw", TokenDType::U32); }),
                  {dir.path + "/a.idx", "sequences end at byte 20, but the .bin holds 16 bytes"});
  // An index cut inside its lengths and offsets.
  write_pair(dir.path + "/b", kDocs32, 4);
  fs::resize_file(dir.path + "/b.idx", 40);
  expect_contains(error_of([&] { TokenArray::open(dir.path + "/b.bin", "raw", TokenDType::U32); }),
                  {dir.path + "/b.idx", "cut short"});
  // One cut before the end of its magic, or empty (an interrupted copy): before, taken for another
  // program's .idx, so the .bin was read without the type check.
  for (const uintmax_t bytes : {0, 4}) {
    write_pair(dir.path + "/m", kDocs32, 4);
    fs::resize_file(dir.path + "/m.idx", bytes);
    expect_contains(error_of([&] { TokenArray::open(dir.path + "/m.bin", "raw", TokenDType::U16); }),
                    {dir.path + "/m.idx", "is cut short (" + std::to_string(bytes) + " bytes", "write it again"});
  }
  // One cut inside its document boundaries (the last part of the file).
  write_pair(dir.path + "/c", kDocs32, 4);
  fs::resize_file(dir.path + "/c.idx", fs::file_size(dir.path + "/c.idx") - 8);
  expect_contains(error_of([&] { TokenArray::open(dir.path + "/c.bin", "raw", TokenDType::U32); }),
                  {dir.path + "/c.idx", "the index is cut short", "write it again"});
}

// A glob that matches the .idx files too (data/*) would read each index as tokens.
TEST(MegatronIndex, AnIndexNamedAsATokenFileIsRefused) {
  moe::testing::TempDir dir;
  write_pair(dir.path + "/a", kDocs32, 4);
  expect_contains(error_of([&] { TokenArray::open(dir.path + "/a.idx", "raw", TokenDType::U32); }),
                  {dir.path + "/a.idx", "is a Megatron-LM index (.idx), not tokens", "*.bin"});
}

// Documents are separated by EOS in the stream; a .bin written without --append-eod has none, which
// the index's document ends show: training is warned, and reads such a file as before.
TEST(MegatronIndex, DocumentsThatDoNotEndWithEosAreWarnedOf) {
  moe::testing::TempDir dir;
  const uint16_t eos = 99;
  write_pair(dir.path + "/with_eod", std::vector<std::vector<uint16_t>>{{5, 6, eos}, {7, eos}, {8, 9, 10, eos}}, 8);
  write_pair(dir.path + "/without", std::vector<std::vector<uint16_t>>{{5, 6}, {7}, {8, 9, 10}}, 8);
  std::vector<std::string> warnings;
  EXPECT_EQ(open_token_files(dir.path + "/with_eod.bin", "raw", TokenDType::U16, "data.path", 100, eos, &warnings)
                .size(), 1u);
  EXPECT_TRUE(warnings.empty()) << warnings[0];
  EXPECT_EQ(open_token_files(dir.path + "/without.bin", "raw", TokenDType::U16, "data.path", 100, eos, &warnings)
                .size(), 1u);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find(dir.path + "/without.bin: 3 of the 3 documents checked"), std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[0].find("--append-eod"), std::string::npos) << warnings[0];
  EXPECT_EQ(megatron_document_ends(dir.path + "/with_eod.bin", TokenDType::U16, 64),
            (std::vector<int64_t>{2, 4, 8}));
}

TEST(MegatronIndex, ABinWithoutAMegatronIndexReadsAsBefore) {
  moe::testing::TempDir dir;
  write_pair(dir.path + "/a", kDocs32, 4);
  fs::remove(dir.path + "/a.idx");
  EXPECT_EQ(TokenArray::open(dir.path + "/a.bin", "raw", TokenDType::U32).size(), 5);
  std::ofstream(dir.path + "/a.idx") << "an index of some other program";
  EXPECT_EQ(TokenArray::open(dir.path + "/a.bin", "raw", TokenDType::U32).size(), 5);
}

}  // namespace

// Byte-level preparation: tokens are the bytes with EOS after each document, dataset.json
// describes the files, and failures leave nothing behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/core/error.h"
#include "moe/data/dataset.h"
#include "moe/data/npy.h"
#include "moe/data/prepare.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moe_prepare_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write_text(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  static std::vector<uint32_t> read_tokens(const std::string& path) {
    const NpyTokens t = NpyTokens::open(path);
    EXPECT_EQ(t.dtype(), TokenDType::U16);
    std::vector<uint32_t> v;
    for (int64_t i = 0; i < t.size(); ++i) v.push_back(t.at(i));
    return v;
  }
  static std::vector<uint32_t> bytes_then_eos(const std::string& s) {
    std::vector<uint32_t> v(s.begin(), s.end());
    for (size_t i = 0; i < s.size(); ++i) v[i] = static_cast<unsigned char>(s[i]);
    v.push_back(256);
    return v;
  }
  fs::path dir_;
};

}  // namespace

TEST_F(PrepareTest, tokens_are_bytes_with_eos_after_each_document_and_dataset_json_lists_files) {
  const std::string alpha_text = "hello world\nsecond line \xc3\xa9\xff\n";
  const std::string beta_text = "doc one\n\f\ndoc two\r\n\f\r\n\f\nlast";  // form-feed lines split documents
  const std::string a = write_text("alpha.txt", alpha_text);
  const std::string b = write_text("beta.md", beta_text);
  const std::string out = (dir_ / "out" / "nested").string();
  const PrepareResult r = prepare_byte_level({a, b}, out);

  ASSERT_EQ(r.files.size(), 2u);
  EXPECT_EQ(read_tokens(out + "/alpha.npy"), bytes_then_eos(alpha_text));
  std::vector<uint32_t> expected_beta = bytes_then_eos("doc one\n");
  for (uint32_t t : bytes_then_eos("doc two\r\n")) expected_beta.push_back(t);
  for (uint32_t t : bytes_then_eos("last")) expected_beta.push_back(t);
  EXPECT_EQ(read_tokens(out + "/beta.npy"), expected_beta);
  EXPECT_EQ(r.files[1].documents, 3);
  EXPECT_EQ(r.total_tokens, static_cast<int64_t>(alpha_text.size() + 1 + expected_beta.size()));

  std::ifstream in(out + "/dataset.json");
  const nlohmann::json meta = nlohmann::json::parse(in);
  EXPECT_EQ(meta["tokenizer"], "byte");
  EXPECT_EQ(meta["vocab_size"], 257);
  EXPECT_EQ(meta["eos_token_id"], 256);
  EXPECT_EQ(meta["dtype"], "uint16");
  ASSERT_EQ(meta["files"].size(), 2u);
  EXPECT_EQ(meta["files"][0]["name"], "alpha.npy");
  EXPECT_EQ(meta["files"][0]["tokens"], alpha_text.size() + 1);
  EXPECT_EQ(meta["files"][0]["source"], a);
  EXPECT_EQ(meta["files"][1]["name"], "beta.npy");
  EXPECT_EQ(meta["files"][1]["tokens"], expected_beta.size());

  // Nothing else left in the folder (no temporaries), and TokenDataset reads it.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(out)) ++entries;
  EXPECT_EQ(entries, 3);
  DataConfig cfg;
  cfg.path = out;
  cfg.eval_fraction = 0.0;
  const TokenDataset ds = TokenDataset::open(cfg, 257, 256);
  EXPECT_EQ(ds.train_tokens(), r.total_tokens);
}

TEST_F(PrepareTest, missing_input_is_an_error_and_creates_nothing) {
  const std::string a = write_text("a.txt", "text");
  const std::string out = (dir_ / "out").string();
  try {
    prepare_byte_level({a, (dir_ / "missing.txt").string()}, out);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.txt"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(PrepareTest, unwritable_output_is_an_error_and_leaves_no_partial_files) {
  const std::string a = write_text("a.txt", "text");
  const std::string blocker = write_text("blocker", "a file, not a folder");
  EXPECT_THROW(prepare_byte_level({a}, blocker), Error);
  EXPECT_THROW(prepare_byte_level({a}, blocker + "/sub"), Error);
  EXPECT_TRUE(fs::is_regular_file(blocker));

  // An existing folder that cannot be written: a read-only folder, or /proc/self for root
  // (which ignores permission bits).
  const bool root = ::geteuid() == 0;
  const fs::path ro = root ? fs::path("/proc/self") : dir_ / "readonly";
  if (!root) {
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  }
  try {
    prepare_byte_level({a}, ro.string());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(ro.string()), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(ro / "a.npy"));
  EXPECT_FALSE(fs::exists(ro / "dataset.json"));
  if (!root) {
    fs::permissions(ro, fs::perms::owner_all);
    EXPECT_TRUE(fs::is_empty(ro));
  }
}

TEST_F(PrepareTest, duplicate_stems_are_an_error_before_anything_is_created) {
  const std::string a = write_text("a.txt", "text");
  fs::create_directories(dir_ / "sub");
  const std::string b = write_text("sub/a.md", "same stem");
  const std::string out = (dir_ / "out2" / "deeper").string();
  EXPECT_THROW(prepare_byte_level({a, b}, out), Error);
  EXPECT_FALSE(fs::exists(dir_ / "out2"));
}

TEST_F(PrepareTest, failure_after_writing_temporaries_removes_them) {
  const std::string a = write_text("a.txt", "first");
  const std::string b = write_text("b.txt", "second");
  const fs::path out = dir_ / "out3";
  fs::create_directories(out / "b.npy");  // a folder where b.npy must go
  try {
    prepare_byte_level({a, b}, out.string());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("b.npy"), std::string::npos) << e.what();
  }
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(out)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"b.npy"});  // only the folder that was there
}

TEST(ByteTokenize, form_feed_lines_split_documents_and_empty_documents_are_dropped) {
  int64_t docs = -1;
  EXPECT_TRUE(byte_tokenize("", &docs).empty());
  EXPECT_EQ(docs, 0);
  EXPECT_EQ(byte_tokenize("\f\n\f\n", &docs).size(), 0u);
  EXPECT_EQ(docs, 0);
  const std::vector<uint16_t> t = byte_tokenize("a\f\nb\n\f", &docs);  // "\f" inside a line is a byte
  EXPECT_EQ(docs, 1);
  const std::vector<uint16_t> expected = {'a', '\f', '\n', 'b', '\n', 256};
  EXPECT_EQ(t, expected);
  EXPECT_EQ(byte_tokenize("x\n\f", &docs), (std::vector<uint16_t>{'x', '\n', 256}));
}

// Which token files a data path names and how they are checked (data/token_sources.h), the same
// for training (TokenDataset) and evaluation (EvalWindows): raw mode refuses .npy files and
// prepared folders; a glob or a file inside a prepared folder is held to its dataset.json; a
// glob that matches nothing says why, naming the pattern; messages name the key or flag given.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <omp.h>
#include <unistd.h>

#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <thread>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "moe/core/error.h"
#include "moe/data/dataset.h"
#include "moe/data/eval_windows.h"
#include "moe/data/npy.h"
#include "moe/data/token_sources.h"
#include "../ckpt/temp_dir.h"
#include "../error_of.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kVocab = 1000;

using moe::testing::error_of;

void expect_contains(const std::string& message, const std::vector<std::string>& parts) {
  ASSERT_FALSE(message.empty()) << "no error";
  for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
}

class TokenSourcesTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return tmp_ / name; }
  // <sub>/<name>: n tokens 0, 1, 2, ... (mod kVocab) as uint16 .npy.
  std::string npy(const std::string& name, int64_t n) const {
    fs::create_directories(fs::path(path(name)).parent_path());
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<uint16_t>(i % kVocab);
    write_npy(path(name), v);
    return path(name);
  }
  // A dataset.json in folder `sub` listing {name: tokens}, as prepare writes it.
  void dataset_json(const std::string& sub, const std::vector<std::pair<std::string, int64_t>>& files,
                    const nlohmann::json& vocab_size = 257, const nlohmann::json& dtype = "uint16",
                    const nlohmann::json& eos_token_id = 256) const {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [name, tokens] : files) list.push_back({{"name", name}, {"tokens", tokens}});
    std::ofstream(path(sub + "/dataset.json")) << nlohmann::json{{"tokenizer", "byte"},
                                                                 {"vocab_size", vocab_size},
                                                                 {"eos_token_id", eos_token_id},
                                                                 {"dtype", dtype},
                                                                 {"files", list}}
                                                      .dump();
  }
  DataConfig config(const std::string& data_path, const std::string& format = "npy") const {
    DataConfig cfg;
    cfg.path = data_path;
    cfg.format = format;
    cfg.eval_fraction = 0.1;
    return cfg;
  }
  // The error of reading `data_path` for training, and for evaluation under `eval_key`.
  std::string train_error(const std::string& data_path, const std::string& format = "npy") const {
    return error_of([&] { TokenDataset::open(config(data_path, format), kVocab, 256); });
  }
  std::string eval_error(const std::string& data_path, const std::string& format = "npy",
                         const std::string& eval_key = "--data") const {
    return error_of([&] { EvalWindows::open(data_path, format, TokenDType::U16, 16, kVocab, 0, eval_key); });
  }

  moe::testing::TempDir tmp_;  // removed with its files when the test ends
};

}  // namespace

TEST_F(TokenSourcesTest, raw_format_refuses_npy_files_and_prepared_folders_naming_them) {
  const std::string a = npy("prepared/a.npy", 500);
  dataset_json("prepared", {{"a.npy", 500}});
  // The folder: its dataset.json says prepare wrote it.
  for (const std::string& msg : {train_error(path("prepared"), "raw"), eval_error(path("prepared"), "raw")})
    expect_contains(msg, {path("prepared"), "dataset.json", "data.format = \"npy\""});
  // A file with a .npy header, named directly or by a glob, in a prepared folder or not: the
  // message names the file.
  npy("loose/b.npy", 500);
  const std::pair<std::string, std::string> named[] = {
      {a, a}, {path("prepared/*.npy"), a}, {path("loose/b.npy"), path("loose/b.npy")}, {path("loose/*"), path("loose/b.npy")}};
  for (const auto& [p, file] : named)
    for (const std::string& msg : {train_error(p, "raw"), eval_error(p, "raw")})
      expect_contains(msg, {file, "starts with the .npy magic", "data.format = \"npy\""});
  // Raw arrays still read, whatever their names (OLMo-core and Dolma write them as .npy).
  fs::create_directories(path("raw"));
  {
    std::ofstream out(path("raw/part-0.npy"), std::ios::binary);
    for (uint16_t t = 0; t < 400; ++t) out.write(reinterpret_cast<const char*>(&t), 2);
  }
  EXPECT_EQ(TokenDataset::open(config(path("raw"), "raw"), kVocab, 256).train_tokens(), 360);
  EXPECT_EQ(EvalWindows::open(path("raw/*.npy"), "raw", TokenDType::U16, 16, kVocab, 0, "--data").size(), 24);
}

TEST_F(TokenSourcesTest, eval_applies_the_dataset_json_checks_that_training_applies) {
  npy("data/a.npy", 500);
  npy("data/b.npy", 300);
  dataset_json("data", {{"a.npy", 500}, {"b.npy", 300}}, /*vocab_size=*/100000);
  for (const std::string& msg : {train_error(path("data")), eval_error(path("data"))})
    expect_contains(msg, {path("data/dataset.json"), "vocab_size 100000", "model.vocab_size = 1000"});
  dataset_json("data", {{"a.npy", 500}, {"b.npy", 299}});
  for (const std::string& msg : {train_error(path("data")), eval_error(path("data"))})
    expect_contains(msg, {path("data/b.npy"), "holds 300 tokens", "lists it with 299"});
  // The files are uint16 .npy: a dataset.json that says uint32 describes other files; a dtype
  // that is no token type is refused, naming the key.
  dataset_json("data", {{"a.npy", 500}, {"b.npy", 300}}, 257, "uint32");
  for (const std::string& msg : {train_error(path("data")), eval_error(path("data")), train_error(path("data/b.npy"))})
    expect_contains(msg, {"holds uint16 tokens (its .npy header)", path("data/dataset.json"), "\"dtype\": \"uint32\""});
  for (const nlohmann::json& bad : {nlohmann::json("int64"), nlohmann::json(16)}) {
    dataset_json("data", {{"a.npy", 500}, {"b.npy", 300}}, 257, bad);
    for (const std::string& msg : {train_error(path("data")), eval_error(path("data"))})
      expect_contains(msg, {path("data/dataset.json"), "\"dtype\" is " + bad.dump(), "expected \"uint16\" or \"uint32\""});
  }
  // vocab_size and eos_token_id that prepare would not write are refused, not skipped (the
  // vocabulary check above would be bypassed).
  for (const auto& [vocab, eos, field] : {std::tuple<nlohmann::json, nlohmann::json, std::string>{"100000", 256, "\"vocab_size\" is \"100000\""},
                                          {100000.0, 256, "\"vocab_size\" is 100000.0"},
                                          {-1, 256, "\"vocab_size\" is -1"},
                                          {257, "x", "\"eos_token_id\" is \"x\""}}) {
    dataset_json("data", {{"a.npy", 500}, {"b.npy", 300}}, vocab, "uint16", eos);
    for (const std::string& msg : {train_error(path("data")), eval_error(path("data"))})
      expect_contains(msg, {path("data/dataset.json"), field, "expected an integer >= "});
  }
  dataset_json("data", {{"a.npy", 500}, {"b.npy", 300}});  // the control
  EXPECT_EQ(EvalWindows::open(path("data"), "npy", TokenDType::U16, 16, kVocab, 0, "--data").size(), 31 + 18);
  EXPECT_EQ(TokenDataset::open(config(path("data")), kVocab, 256).files().size(), 2u);
}

TEST_F(TokenSourcesTest, a_glob_or_a_file_inside_a_prepared_folder_is_held_to_its_dataset_json) {
  npy("data/a.npy", 500);
  npy("data/b.npy", 300);
  dataset_json("data", {{"a.npy", 500}, {"b.npy", 299}});
  // A wrong token count is found whichever way the file is named.
  for (const std::string& p : {path("data/*.npy"), path("data/b.npy"), path("data/b*")})
    for (const std::string& msg : {train_error(p), eval_error(p)}) expect_contains(msg, {"lists it with 299"});
  // A glob picks part of the dataset: a.npy alone is fine, and dataset.json itself is not a token file.
  dataset_json("data", {{"a.npy", 500}, {"b.npy", 300}}, /*vocab_size=*/100000);
  expect_contains(train_error(path("data/a*")), {"vocab_size 100000"});
  dataset_json("data", {{"a.npy", 500}, {"b.npy", 300}});
  EXPECT_EQ(TokenDataset::open(config(path("data/a*")), kVocab, 256).files().size(), 1u);
  EXPECT_EQ(TokenDataset::open(config(path("data/*")), kVocab, 256).files().size(), 2u);
  // A match that dataset.json does not list is refused, as in the folder.
  npy("data/extra.npy", 200);
  for (const std::string& p : {path("data/*.npy"), path("data/extra.npy")})
    for (const std::string& msg : {train_error(p), eval_error(p)})
      expect_contains(msg, {path("data/extra.npy"), "is not listed in " + path("data/dataset.json")});
  fs::remove(path("data/extra.npy"));
  // A listed file the glob would match but that is missing is refused; one it would not match is
  // not its business.
  fs::remove(path("data/b.npy"));
  for (const std::string& msg : {train_error(path("data/*.npy")), eval_error(path("data/*.npy"))})
    expect_contains(msg, {path("data/dataset.json"), "lists b.npy", path("data/b.npy"), "does not exist"});
  EXPECT_EQ(TokenDataset::open(config(path("data/a*")), kVocab, 256).files().size(), 1u);
}

// A reader that meets files dataset.json does not list while a prepare --append holds the folder's
// lock (it renames the new .npy files in before the dataset.json that lists them) waits for it and
// reads the whole new dataset; with no writer holding the folder the files are refused at once.
TEST_F(TokenSourcesTest, unlisted_files_of_an_append_in_progress_are_waited_for_not_refused) {
  npy("data/a.npy", 500);
  dataset_json("data", {{"a.npy", 500}});
  npy("data/b.npy", 300);  // renamed in by the append; its dataset.json not yet
  for (const std::string& p : {path("data"), path("data/*.npy")}) {
    const int fd = ::open(path("data").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // as prepare holds it
    std::thread append([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      dataset_json("data", {{"a.npy", 500}, {"b.npy", 300}});
      ::flock(fd, LOCK_UN);
      ::close(fd);
    });
    size_t files = 0;
    const std::string msg = error_of([&] { files = TokenDataset::open(config(p), kVocab, 256).files().size(); });
    append.join();
    EXPECT_EQ(msg, "") << p;
    EXPECT_EQ(files, 2u) << p;
    dataset_json("data", {{"a.npy", 500}});
  }
  expect_contains(train_error(path("data")), {path("data/b.npy"), "is not listed in"});
}

TEST_F(TokenSourcesTest, a_glob_that_matches_nothing_says_why_naming_the_pattern) {
  npy("data/a.npy", 500);
  const struct {
    std::string pattern;
    std::vector<std::string> needles;
  } cases[] = {
      {path("nope/*.npy"), {"--data = \"" + path("nope/*.npy") + "\"", "the folder " + path("nope") + " does not exist"}},
      {path("data/x*.npy"), {"--data = \"" + path("data/x*.npy") + "\"", "no path matches the pattern"}},
      {path("d*"), {"--data = \"" + path("d*") + "\"", "its one match, " + path("data") + ", is a folder"}},
      {path("no*/a.npy"), {"--data = \"" + path("no*/a.npy") + "\"", "no path matches"}},
  };
  for (const auto& c : cases) {
    const std::string msg = eval_error(c.pattern);
    expect_contains(msg, c.needles);
    EXPECT_EQ(msg.find("could not be read"), std::string::npos) << msg;
  }
  expect_contains(train_error(path("nope/*.npy")), {"data.path = \"" + path("nope/*.npy") + "\"", "does not exist"});
}

TEST_F(TokenSourcesTest, messages_name_the_key_or_flag_that_gave_the_path) {
  fs::create_directories(path("empty"));
  expect_contains(eval_error(path("empty")), {"--data: folder '" + path("empty") + "' contains no .npy token files"});
  expect_contains(eval_error(path("empty"), "npy", "eval.sets[0].path"), {"eval.sets[0].path: folder"});
  expect_contains(train_error(path("empty")), {"data.path: folder"});
  EXPECT_EQ(eval_error(path("empty")).find("data.path"), std::string::npos);
}

TEST_F(TokenSourcesTest, a_dataset_json_that_is_a_directory_is_named_as_such) {
  npy("data/a.npy", 500);
  fs::create_directories(path("data/dataset.json"));
  for (const std::string& msg : {train_error(path("data")), eval_error(path("data")), eval_error(path("data/*.npy"))})
    expect_contains(msg, {path("data/dataset.json"), "is a directory"});
}

TEST_F(TokenSourcesTest, names_read_from_dataset_json_are_quoted_printably) {
  npy("data/a.npy", 500);
  std::ofstream(path("data/dataset.json")) << "{\"files\": [{\"name\": \"a\\u0000b\\nc.txt\"}]}";
  const std::string msg = train_error(path("data"));
  expect_contains(msg, {"a\\x00b\\nc.txt", "not a file name ending in .npy"});
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

// Each file's checksum of its token bytes (by which ranks compare node-local copies) comes from the
// pass that checks the tokens: the XXH3-64 of its 4 MiB pieces' XXH3-64s (computed here the plain
// way, serially), the same at 1, 2 and 4 threads for uint16 and uint32 files of many pieces and for
// an empty file; one token changed changes it; the first out-of-vocabulary token is still the
// first in the file when a later piece also holds one.
static uint64_t plain_checksum(const std::vector<unsigned char>& bytes) {
  constexpr size_t kPiece = size_t{4} << 20;
  std::vector<XXH64_hash_t> pieces;
  for (size_t at = 0; at < bytes.size(); at += kPiece)
    pieces.push_back(XXH3_64bits(bytes.data() + at, std::min(kPiece, bytes.size() - at)));
  return XXH3_64bits(pieces.data(), pieces.size() * sizeof(XXH64_hash_t));
}

template <typename T>
static std::vector<unsigned char> bytes_of(const std::vector<T>& v) {
  std::vector<unsigned char> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST_F(TokenSourcesTest, each_file_has_a_checksum_of_its_tokens_at_any_thread_count) {
  const int64_t n = (19 << 20) + 5;  // 38 MiB + 10 bytes of uint16: ten pieces, the last one short
  std::vector<uint16_t> v16(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v16[static_cast<size_t>(i)] = static_cast<uint16_t>((i * 7919) % kVocab);
  std::vector<uint32_t> v32(v16.begin(), v16.begin() + (11 << 20) + 3);  // 44 MiB + 12 bytes: twelve pieces
  fs::create_directories(path("c"));
  write_npy(path("c/a16.npy"), v16);
  write_npy(path("c/a32.npy"), v32);
  write_npy(path("c/empty.npy"), std::vector<uint16_t>{});
  const std::vector<std::pair<std::string, uint64_t>> expected = {{"c/a16.npy", plain_checksum(bytes_of(v16))},
                                                                  {"c/a32.npy", plain_checksum(bytes_of(v32))},
                                                                  {"c/empty.npy", plain_checksum({})}};
  const int threads = omp_get_max_threads();
  for (int t : {1, 2, 4}) {
    omp_set_num_threads(t);
    for (const auto& [name, sum] : expected) {
      std::vector<uint64_t> one;
      const TokenDType dtype = name == "c/a32.npy" ? TokenDType::U32 : TokenDType::U16;
      open_token_files(path(name), "npy", dtype, "data.path", kVocab, std::nullopt, nullptr, &one);
      ASSERT_EQ(one.size(), 1u);
      EXPECT_EQ(one[0], sum) << name << " at " << t << " threads";
    }
  }
  omp_set_num_threads(threads);
  // One token changed (in the last piece) changes it; the training data's files carry the same checksums.
  v16[static_cast<size_t>(n - 7)] ^= 1;
  write_npy(path("c/b16.npy"), v16);
  std::vector<uint64_t> changed;
  open_token_files(path("c/b16.npy"), "npy", TokenDType::U16, "data.path", kVocab, std::nullopt, nullptr, &changed);
  EXPECT_NE(changed.at(0), expected[0].second);
  EXPECT_EQ(changed.at(0), plain_checksum(bytes_of(v16)));
  EXPECT_EQ(TokenDataset::open(config(path("c/a16.npy")), kVocab, 256).files().at(0).checksum, expected[0].second);
  v16[static_cast<size_t>(n - 7)] = 4000;          // out of the vocabulary in the last piece
  v16[static_cast<size_t>((6 << 20) + 3)] = 5000;  // and earlier, in the fourth piece
  write_npy(path("c/c16.npy"), v16);
  expect_contains(train_error(path("c/c16.npy")), {"token 5000 at index " + std::to_string((6 << 20) + 3)});
}

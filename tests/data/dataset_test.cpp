// TokenDataset: deterministic, topology-independent training windows inside the training split;
// held-out windows inside the tails; vocabulary and shape errors naming the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/core/error.h"
#include "moe/data/dataset.h"
#include "moe/data/npy.h"
#include "moe/data/synthetic.h"
#include "../error_of.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

// Token at index i of file f: f * kFileStride + i, so a window tells its file and position.
constexpr uint32_t kFileStride = 1u << 20;
constexpr int64_t kBigVocab = int64_t{8} << 20;

class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moe_dataset_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_positional(int file_index, int64_t n) {
    std::vector<uint32_t> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = file_index * kFileStride + static_cast<uint32_t>(i);
    write_npy((dir_ / ("f" + std::to_string(file_index) + ".npy")).string(), v);
  }
  void write_dataset_json(const nlohmann::json& files) const {
    std::ofstream((dir_ / "dataset.json").string())
        << nlohmann::json{{"tokenizer", "test"}, {"vocab_size", kBigVocab}, {"files", files}}.dump();
  }
  DataConfig config() const {
    DataConfig cfg;
    cfg.path = dir_.string();
    cfg.eval_fraction = 0.1;
    return cfg;
  }

  fs::path dir_;
};

using moe::testing::error_of;

}  // namespace

TEST_F(DatasetTest, train_windows_deterministic_and_independent_of_how_the_batch_is_split) {
  write_positional(0, 1000);
  write_positional(1, 3000);
  write_positional(2, 517);
  const TokenDataset ds = TokenDataset::open(config(), kBigVocab, 0);
  const int64_t batch = 16, seq = 32;
  std::vector<int32_t> in_all(batch * seq), tg_all(batch * seq);
  ds.train_batch(5, 0, batch, seq, in_all.data(), tg_all.data());
  for (int64_t split : {1, 2, 4, 8}) {  // e.g. data-parallel ranks each asking for their rows
    std::vector<int32_t> in(batch * seq), tg(batch * seq);
    for (int64_t first = 0; first < batch; first += batch / split)
      ds.train_batch(5, first, batch / split, seq, in.data() + first * seq, tg.data() + first * seq);
    EXPECT_EQ(in, in_all) << "split " << split;
    EXPECT_EQ(tg, tg_all) << "split " << split;
  }
  // Reopening gives the same windows; another step gives others.
  const TokenDataset again = TokenDataset::open(config(), kBigVocab, 0);
  std::vector<int32_t> in2(batch * seq), tg2(batch * seq);
  again.train_batch(5, 0, batch, seq, in2.data(), tg2.data());
  EXPECT_EQ(in2, in_all);
  again.train_batch(6, 0, batch, seq, in2.data(), tg2.data());
  EXPECT_NE(in2, in_all);
  DataConfig other = config();
  other.seed = 4321;
  TokenDataset::open(other, kBigVocab, 0).train_batch(5, 0, batch, seq, in2.data(), tg2.data());
  EXPECT_NE(in2, in_all);
}

TEST_F(DatasetTest, train_windows_lie_inside_one_file_training_split_and_targets_are_shifted_inputs) {
  const std::vector<int64_t> lengths = {1000, 3000, 517};
  for (int f = 0; f < 3; ++f) write_positional(f, lengths[f]);
  const TokenDataset ds = TokenDataset::open(config(), kBigVocab, 0);
  ASSERT_EQ(ds.files().size(), 3u);
  for (int f = 0; f < 3; ++f) {
    const int64_t held = static_cast<int64_t>(0.1 * lengths[f]);
    EXPECT_EQ(ds.files()[f].train_length, lengths[f] - held);
    EXPECT_EQ(ds.files()[f].eval_begin, lengths[f] - held);
    EXPECT_EQ(ds.files()[f].eval_length, held);
  }
  EXPECT_EQ(ds.train_tokens() + ds.eval_tokens(), 4517);
  const int64_t batch = 64, seq = 50;
  std::vector<int32_t> in(batch * seq), tg(batch * seq);
  std::vector<int64_t> per_file(3, 0);
  bool saw_last_train_token = false;
  for (int64_t step = 0; step < 200; ++step) {
    ds.train_batch(step, 0, batch, seq, in.data(), tg.data());
    for (int64_t r = 0; r < batch; ++r) {
      const int32_t* x = &in[r * seq];
      const int32_t* y = &tg[r * seq];
      const int f = x[0] / kFileStride;
      const int64_t start = x[0] % kFileStride;
      ++per_file[f];
      for (int64_t t = 0; t < seq; ++t) {
        ASSERT_EQ(x[t], x[0] + t) << "window crosses a file or is not consecutive";
        ASSERT_EQ(y[t], x[t] + 1) << "targets are not the inputs shifted by one";
      }
      ASSERT_LE(start + seq, ds.files()[f].train_length - 1) << "window enters the held-out tail";
      saw_last_train_token = saw_last_train_token || start + seq == ds.files()[f].train_length - 1;
    }
  }
  EXPECT_TRUE(saw_last_train_token);
  // Files are chosen proportionally to their training length (900 : 2700 : 466).
  const double total = 200.0 * batch;
  EXPECT_NEAR(per_file[0] / total, 900.0 / 4066, 0.02);
  EXPECT_NEAR(per_file[1] / total, 2700.0 / 4066, 0.02);
  EXPECT_NEAR(per_file[2] / total, 466.0 / 4066, 0.02);
}

TEST_F(DatasetTest, eval_windows_are_consecutive_non_overlapping_inside_the_held_out_tails) {
  write_positional(0, 1000);  // tail 100 tokens -> 4 windows of 21
  write_positional(1, 3000);  // tail 300 -> 14 windows
  write_positional(2, 150);   // tail 15 -> none
  const TokenDataset ds = TokenDataset::open(config(), kBigVocab, 0);
  const int64_t seq = 20;
  ASSERT_EQ(ds.eval_num_sequences(seq), 4 + 14);
  std::vector<int32_t> in(18 * seq), tg(18 * seq);
  ds.eval_batch(0, 18, seq, in.data(), tg.data());
  for (int64_t r = 0; r < 18; ++r) {
    const int f = r < 4 ? 0 : 1;
    const int64_t k = r < 4 ? r : r - 4;
    const int64_t expected_start = ds.files()[f].eval_begin + k * (seq + 1);
    for (int64_t t = 0; t < seq; ++t) {
      ASSERT_EQ(in[r * seq + t], static_cast<int32_t>(f * kFileStride + expected_start + t)) << r;
      ASSERT_EQ(tg[r * seq + t], in[r * seq + t] + 1);
    }
  }
  // Partial ranges read the same windows.
  std::vector<int32_t> in5(3 * seq), tg5(3 * seq);
  ds.eval_batch(3, 3, seq, in5.data(), tg5.data());
  EXPECT_TRUE(std::equal(in5.begin(), in5.end(), in.begin() + 3 * seq));
  EXPECT_THROW(ds.eval_batch(17, 2, seq, in5.data(), tg5.data()), Error);
}

TEST_F(DatasetTest, mixed_uint16_and_uint32_files) {
  std::vector<uint16_t> a(400);
  std::vector<uint32_t> b(400);
  for (int i = 0; i < 400; ++i) a[i] = static_cast<uint16_t>(i % 300), b[i] = static_cast<uint32_t>(300 + i % 200);
  write_npy((dir_ / "a.npy").string(), a);
  write_npy((dir_ / "b.npy").string(), b);
  std::ofstream((dir_ / "notes.txt").string()) << "ignored";
  const TokenDataset ds = TokenDataset::open(config(), 500, 499);
  EXPECT_EQ(ds.files().size(), 2u);
  EXPECT_FALSE(ds.attainable_loss().has_value());
  EXPECT_NE(ds.describe().find("2 .npy files"), std::string::npos) << ds.describe();
  std::vector<int32_t> in(32 * 16), tg(32 * 16);
  ds.train_batch(0, 0, 32, 16, in.data(), tg.data());
  for (int32_t v : in) EXPECT_LT(v, 500);
}

TEST_F(DatasetTest, token_outside_vocab_is_rejected_naming_file_index_and_value) {
  std::vector<uint16_t> a(100, 5);
  a[73] = 300;
  write_npy((dir_ / "good.npy").string(), std::vector<uint16_t>(100, 1));
  write_npy((dir_ / "bad.npy").string(), a);
  const std::string msg = error_of([&] { TokenDataset::open(config(), 257, 256); });
  EXPECT_NE(msg.find("bad.npy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("token 300 at index 73"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocab_size 257"), std::string::npos) << msg;
}

TEST_F(DatasetTest, a_file_shorter_than_one_window_is_skipped_with_a_warning_naming_it) {
  write_positional(0, 1000);
  write_positional(1, 40);  // training split 36 tokens
  const TokenDataset ds = TokenDataset::open(config(), kBigVocab, 0);
  EXPECT_TRUE(ds.check_window(32).empty());  // needs 33 <= 36
  const std::vector<std::string> warnings = ds.check_window(64);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("f1.npy"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("36 tokens"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("65"), std::string::npos) << warnings[0];
  // Windows of 65 tokens come from the other file only.
  std::vector<int32_t> in(64 * 16), tg(64 * 16);
  ds.train_batch(0, 0, 16, 64, in.data(), tg.data());
  for (int32_t t : in) EXPECT_EQ(static_cast<uint32_t>(t) / kFileStride, 0u);
  // When no file of a source holds a window, the source is named.
  const std::string msg = error_of([&] { ds.check_window(2000); });
  EXPECT_NE(msg.find("data.path"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no file holds a training window"), std::string::npos) << msg;
}

TEST_F(DatasetTest, missing_or_empty_folder_and_bad_files_are_clear_errors) {
  DataConfig cfg = config();
  cfg.path = (dir_ / "nope").string();
  std::string msg = error_of([&] { TokenDataset::open(cfg, 100, 99); });
  EXPECT_NE(msg.find("nope"), std::string::npos) << msg;
  msg = error_of([&] { TokenDataset::open(config(), 100, 99); });
  EXPECT_NE(msg.find("contains no .npy"), std::string::npos) << msg;
  std::ofstream((dir_ / "junk.npy").string()) << "not a numpy file";
  msg = error_of([&] { TokenDataset::open(config(), 100, 99); });
  EXPECT_NE(msg.find("junk.npy"), std::string::npos) << msg;
  cfg = config();
  cfg.eval_fraction = 1.0;
  msg = error_of([&] { TokenDataset::open(cfg, 100, 99); });
  EXPECT_NE(msg.find("data.eval_fraction"), std::string::npos) << msg;
}

TEST_F(DatasetTest, dataset_json_lists_the_files_read_and_they_are_taken_in_name_order) {
  write_positional(0, 1000);
  write_positional(1, 3000);
  // Windows without dataset.json (every .npy in name order) ...
  const TokenDataset plain = TokenDataset::open(config(), kBigVocab, 0);
  const int64_t batch = 16, seq = 32;
  std::vector<int32_t> in_plain(batch * seq), tg_plain(batch * seq), in(batch * seq), tg(batch * seq);
  plain.train_batch(7, 0, batch, seq, in_plain.data(), tg_plain.data());
  // ... are the windows of the same files listed in another order, so adding dataset.json to a
  // folder (or listing files in prepare's input order) does not change a run.
  write_dataset_json({{{"name", "f1.npy"}, {"tokens", 3000}}, {{"name", "f0.npy"}}});
  const TokenDataset listed = TokenDataset::open(config(), kBigVocab, 0);
  ASSERT_EQ(listed.files().size(), 2u);
  EXPECT_EQ(listed.files()[0].name, (dir_ / "f0.npy").string());
  EXPECT_EQ(listed.files()[1].name, (dir_ / "f1.npy").string());
  listed.train_batch(7, 0, batch, seq, in.data(), tg.data());
  EXPECT_EQ(in, in_plain);
  EXPECT_EQ(tg, tg_plain);
}

TEST_F(DatasetTest, npy_file_that_dataset_json_does_not_list_is_an_error_naming_it_and_the_fix) {
  write_positional(0, 1000);
  write_positional(1, 1000);
  write_positional(2, 1000);
  write_dataset_json({{{"name", "f0.npy"}}, {{"name", "f2.npy"}}});
  const std::string msg = error_of([&] { TokenDataset::open(config(), kBigVocab, 0); });
  EXPECT_NE(msg.find((dir_ / "f1.npy").string() + " is not listed in " + (dir_ / "dataset.json").string()),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("prepare --append"), std::string::npos) << msg;
  // Other files (not .npy) are not token data and do not matter.
  fs::remove(dir_ / "f1.npy");
  std::ofstream((dir_ / "notes.txt").string()) << "about this data";
  EXPECT_EQ(TokenDataset::open(config(), kBigVocab, 0).files().size(), 2u);
}

TEST_F(DatasetTest, file_that_dataset_json_lists_but_is_missing_is_an_error_naming_both) {
  write_positional(0, 1000);
  write_dataset_json({{{"name", "f0.npy"}}, {{"name", "gone.npy"}}});
  const std::string msg = error_of([&] { TokenDataset::open(config(), kBigVocab, 0); });
  EXPECT_NE(msg.find((dir_ / "dataset.json").string() + " lists gone.npy"), std::string::npos) << msg;
  EXPECT_NE(msg.find((dir_ / "gone.npy").string() + " does not exist"), std::string::npos) << msg;
}

TEST_F(DatasetTest, token_count_that_differs_from_dataset_json_is_an_error_naming_the_file) {
  write_positional(0, 1000);
  write_dataset_json({{{"name", "f0.npy"}, {"tokens", 999}}});
  const std::string msg = error_of([&] { TokenDataset::open(config(), kBigVocab, 0); });
  EXPECT_NE(msg.find((dir_ / "f0.npy").string() + " holds 1000 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lists it with 999"), std::string::npos) << msg;
  write_dataset_json({{{"name", "f0.npy"}, {"tokens", 1000}}});
  EXPECT_EQ(TokenDataset::open(config(), kBigVocab, 0).train_tokens(), 900);  // 0.1 held out
}

TEST_F(DatasetTest, malformed_dataset_json_is_an_error_naming_it_and_the_field) {
  write_positional(0, 1000);
  const std::string json_path = (dir_ / "dataset.json").string();
  const std::pair<std::string, std::string> cases[] = {
      {"{\"files\": [", "is not valid JSON"},
      {"[1, 2]", "is not a JSON object"},
      {"{\"vocab_size\": 5}", "has no \"files\""},
      {"{\"files\": []}", "\"files\" must be a non-empty array"},
      {"{\"files\": [\"f0.npy\"]}", "\"files[0]\" must be an object with a \"name\""},
      {"{\"files\": [{\"name\": \"../f0.npy\"}]}", "\"files[0].name\" is \"../f0.npy\""},
      {"{\"files\": [{\"name\": \"f0.txt\"}]}", "\"files[0].name\" is \"f0.txt\""},
      {"{\"files\": [{\"name\": \"f0.npy\"}, {\"name\": \"f0.npy\"}]}", "\"files[1].name\" lists f0.npy a second"},
      {"{\"files\": [{\"name\": \"f0.npy\", \"tokens\": -1}]}", "\"files[0].tokens\" must be an integer >= 0"},
  };
  for (const auto& [text, expected] : cases) {
    std::ofstream(json_path) << text;
    const std::string msg = error_of([&] { TokenDataset::open(config(), kBigVocab, 0); });
    EXPECT_NE(msg.find(json_path), std::string::npos) << text << ": " << msg;
    EXPECT_NE(msg.find(expected), std::string::npos) << text << ": " << msg;
  }
  std::ofstream(json_path) << "{\"files\": [{\"name\": \"f0.npy\", \"tokens\": 1000}]}";  // the control
  EXPECT_EQ(TokenDataset::open(config(), kBigVocab, 0).files().size(), 1u);
}

// A vocabulary whose synthetic-corpus tables could not fit is refused naming the key, before any
// allocation (it was met by the kernel's out-of-memory killer, with no message); one past the
// key's range is refused naming the key and the range.
TEST(SyntheticDataset, a_vocabulary_too_large_for_the_corpus_tables_is_refused_naming_the_key) {
  DataConfig cfg;
  cfg.synthetic_tokens = 1000;
  cfg.synthetic_eval_tokens = 100;
  cfg.synthetic_successors = int64_t{1} << 20;  // ~24 PiB of tables: more than half of any machine's memory
  const int64_t huge = int64_t{1} << 31;
  std::string msg = error_of([&] { TokenDataset::open(cfg, huge, 0); });
  EXPECT_NE(msg.find("model.vocab_size = 2147483648 needs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("GiB for the synthetic corpus's tables"), std::string::npos) << msg;
  cfg.synthetic_successors = 6;
  msg = error_of([&] { SyntheticCorpus(huge + 1, 0, cfg); });
  EXPECT_NE(msg.find("model.vocab_size = 2147483649 is outside [2, 2147483648]"), std::string::npos) << msg;
}

TEST(SyntheticDataset, streams_splits_and_attainable_loss) {
  DataConfig cfg;
  cfg.synthetic_tokens = 50000;
  cfg.synthetic_eval_tokens = 5000;
  const TokenDataset ds = TokenDataset::open(cfg, 512, 511);
  const SyntheticCorpus corpus(512, 511, cfg);
  ASSERT_TRUE(ds.attainable_loss().has_value());
  EXPECT_DOUBLE_EQ(*ds.attainable_loss(), corpus.entropy_rate_nats());
  EXPECT_EQ(ds.train_tokens(), 50000);
  EXPECT_EQ(ds.eval_tokens(), 5000);
  EXPECT_NE(ds.describe().find("synthetic"), std::string::npos) << ds.describe();
  // The held-out split is stream 1 of the corpus, read in consecutive windows.
  std::vector<int32_t> held;
  corpus.generate(1, 5000, held);
  const int64_t seq = 64;
  ASSERT_EQ(ds.eval_num_sequences(seq), 5000 / 65);
  std::vector<int32_t> in(2 * seq), tg(2 * seq);
  ds.eval_batch(0, 2, seq, in.data(), tg.data());
  for (int64_t t = 0; t < seq; ++t) {
    EXPECT_EQ(in[t], held[t]);
    EXPECT_EQ(tg[t], held[t + 1]);
    EXPECT_EQ(in[seq + t], held[65 + t]);
  }
  // Training windows come from stream 0.
  std::vector<int32_t> train;
  corpus.generate(0, 50000, train);
  std::vector<int32_t> bin(8 * seq), btg(8 * seq);
  ds.train_batch(3, 0, 8, seq, bin.data(), btg.data());
  for (int64_t r = 0; r < 8; ++r) {
    const auto it = std::search(train.begin(), train.end(), bin.begin() + r * seq, bin.begin() + (r + 1) * seq);
    ASSERT_NE(it, train.end()) << "window " << r << " not found in the training stream";
    EXPECT_EQ(btg[r * seq + seq - 1], *(it + seq));
  }
}

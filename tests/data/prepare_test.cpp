// Byte-level preparation: tokens are the bytes with EOS after each document, dataset.json
// describes the files, and failures leave nothing behind.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/core/error.h"
#include "moe/data/dataset.h"
#include "moe/data/token_array.h"
#include "moe/data/prepare.h"
#include "../error_of.h"
#include "../process_state.h"

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
    const TokenArray t = TokenArray::open_npy(path);
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
  // Every file under `dir` (relative name -> bytes), so a test can check that nothing changed.
  static std::map<std::string, std::string> snapshot(const fs::path& dir) {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      const std::string name = fs::relative(e.path(), dir).string();
      if (!e.is_regular_file()) {
        files[name] = "<not a file>";
        continue;
      }
      std::ifstream in(e.path(), std::ios::binary);
      files[name] = std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    return files;
  }
  static nlohmann::json read_json(const fs::path& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  }
  fs::path dir_;
};

using moe::testing::error_of;

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

// For root: an existing empty folder of sysfs in which creating a file fails (checked here), or
// an empty path when there is none.
static fs::path empty_folder_nobody_can_write() {
  std::error_code ec;
  for (const char* parent : {"/sys/class", "/sys/kernel", "/sys/fs"})
    for (const fs::directory_entry& e : fs::directory_iterator(parent, ec)) {
      if (!e.is_directory(ec) || e.is_symlink(ec) || !fs::is_empty(e.path(), ec) || ec) continue;
      const fs::path probe = e.path() / ".moe-probe";
      if (std::FILE* f = std::fopen(probe.c_str(), "wbx")) {
        std::fclose(f);
        fs::remove(probe, ec);
        continue;
      }
      return e.path();
    }
  return {};
}

TEST_F(PrepareTest, unwritable_output_is_an_error_and_leaves_no_partial_files) {
  const std::string a = write_text("a.txt", "text");
  const std::string blocker = write_text("blocker", "a file, not a folder");
  EXPECT_THROW(prepare_byte_level({a}, blocker), Error);
  EXPECT_THROW(prepare_byte_level({a}, blocker + "/sub"), Error);
  EXPECT_TRUE(fs::is_regular_file(blocker));

  // An existing empty folder that cannot be written: a read-only folder, or for root (which ignores
  // permission bits) an empty folder of sysfs, where no one creates files. (A non-empty one is
  // refused before any write is tried, even with --append, unless it holds a dataset.json.)
  const bool root = ::geteuid() == 0;
  const fs::path ro = root ? empty_folder_nobody_can_write() : dir_ / "readonly";
  if (ro.empty()) GTEST_SKIP() << "running as root, and no empty sysfs folder found to stand for a read-only one";
  if (!root) {
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  }
  try {
    prepare_byte_level({a}, ro.string(), /*append=*/true);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(ro.string()), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(ro / "a.npy"));
  EXPECT_FALSE(fs::exists(ro / "dataset.json"));
  // Said before any input is read: an input that holds no text (a lone document separator) would
  // otherwise be the error, after reading it (before, a large input was tokenized first).
  const std::string no_text = write_text("no_text.txt", "\f\n");
  const std::string no_text_error = error_of([&] { prepare_byte_level({no_text}, (dir_ / "fresh").string()); });
  EXPECT_NE(no_text_error.find("holds no text"), std::string::npos) << no_text_error;
  const std::string ro_error = error_of([&] { prepare_byte_level({no_text}, ro.string(), /*append=*/true); });
  EXPECT_NE(ro_error.find("cannot create files in the output folder " + ro.string()), std::string::npos) << ro_error;
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

TEST_F(PrepareTest, failure_after_writing_temporaries_removes_them_and_leaves_the_dataset_as_it_was) {
  const std::string a = write_text("a.txt", "first");
  const std::string b = write_text("b.txt", "second");
  const std::string c = write_text("c.txt", "");  // no text: refused once b's temporary is written
  const fs::path out = dir_ / "out3";
  prepare_byte_level({a}, out.string());
  const auto before = snapshot(out);
  const std::string msg = error_of([&] { prepare_byte_level({b, c}, out.string(), /*append=*/true); });
  EXPECT_NE(msg.find(c + " holds no text"), std::string::npos) << msg;
  EXPECT_EQ(snapshot(out), before);  // b's temporary removed, a.npy and dataset.json untouched
  // The same into a new folder: the folders this call created go too.
  const std::string msg_new = error_of([&] { prepare_byte_level({b, c}, (dir_ / "new" / "out").string()); });
  EXPECT_NE(msg_new.find("holds no text"), std::string::npos) << msg_new;
  EXPECT_FALSE(fs::exists(dir_ / "new"));
}

// A full disk, by way of RLIMIT_FSIZE (SIGXFSZ ignored, so a write fails with EFBIG), while an
// --append writes its token file or, with room for that one, dataset.json: the error names the
// temporary file and the reason (it said "No such file or directory", an earlier call's errno, for
// the token file, and no reason for dataset.json), and the folder is left as it was.
TEST_F(PrepareTest, append_that_hits_a_full_disk_names_the_file_and_reason_and_leaves_the_folder_as_it_was) {
  const fs::path out = dir_ / "out";
  prepare_byte_level({write_text("a.txt", "first")}, out.string());
  const auto before = snapshot(out);
  const std::string b = write_text("b.txt", "second");  // b.npy: 128 header bytes + 7 tokens
  struct Case {
    rlim_t limit;
    std::string temp;
  };
  for (const Case& c : {Case{100, ".b.npy.tmp-"}, Case{200, ".dataset.json.tmp-"}}) {
    ASSERT_GT(fs::file_size(out / "dataset.json"), 200u) << "dataset.json must outgrow the second limit";
    const std::string msg = moe::testing::error_under_file_size_limit(
        c.limit, [&] { prepare_byte_level({b}, out.string(), /*append=*/true); });
    EXPECT_NE(msg.find((out / c.temp).string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
    EXPECT_EQ(snapshot(out), before);
  }
  prepare_byte_level({b}, out.string(), /*append=*/true);  // with room again
  EXPECT_EQ(read_json(out / "dataset.json")["files"].size(), 2u);
}

// A prepare killed outright (SIGKILL, a crash, a power cut) leaves its temporary files; another
// prepare names them as such, refuses with or without --append, and never deletes them itself.
TEST_F(PrepareTest, temporary_files_left_by_a_killed_prepare_are_named_and_refused_not_deleted) {
  const std::string a = write_text("a.txt", "first\n");
  const std::string b = write_text("b.txt", "second\n");
  const fs::path out = dir_ / "out";
  fs::create_directories(out);
  // Process ids that are not running (above the kernel's pid_max of 4194304).
  std::ofstream(out / ".big.npy.tmp-99999990") << "half a token file";
  std::ofstream(out / ".big.npy.tmp-99999991.tmp-99999991") << "the name older versions wrote tokens under";
  std::ofstream(out / ".dataset.json.tmp-99999990") << "{";
  std::ofstream(out / ".write-check.tmp-99999990") << "";  // killed between creating and removing it
  std::ofstream(out / ".notes.txt.tmp-99999990") << "not a name prepare writes";
  const auto before = snapshot(out);
  for (const bool append : {false, true}) {
    const std::string msg = error_of([&] { prepare_byte_level({a}, out.string(), append); });
    for (const char* name : {".big.npy.tmp-99999990", ".big.npy.tmp-99999991.tmp-99999991", ".dataset.json.tmp-99999990",
                           ".write-check.tmp-99999990"})
      EXPECT_NE(msg.find((out / name).string()), std::string::npos) << name << ": " << msg;
    EXPECT_EQ(msg.find(".notes.txt.tmp-"), std::string::npos) << msg;
    EXPECT_NE(msg.find("left by an interrupted prepare"), std::string::npos) << msg;
    EXPECT_NE(msg.find("safe to delete"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("pass --append"), std::string::npos) << msg;
    EXPECT_EQ(snapshot(out), before) << "append " << append;
  }
  // Once they are deleted, the folder holds only the user's file and no dataset.json: not a
  // dataset prepare wrote, so --append is refused there too, naming them (it used to write the
  // token files and a dataset.json among the user's files); emptied, it takes the inputs.
  for (const char* name : {".big.npy.tmp-99999990", ".big.npy.tmp-99999991.tmp-99999991", ".dataset.json.tmp-99999990",
                           ".write-check.tmp-99999990"})
    fs::remove(out / name);
  const auto user_only = snapshot(out);
  const std::string foreign = error_of([&] { prepare_byte_level({a, b}, out.string(), /*append=*/true); });
  for (const std::string& part : std::vector<std::string>{out.string() + " holds .notes.txt.tmp-99999990 but no "
                                                         "dataset.json",
                                                         "not a dataset prepare or tokenize_hf.py wrote",
                                                         "new or empty folder"})
    EXPECT_NE(foreign.find(part), std::string::npos) << foreign;
  EXPECT_EQ(snapshot(out), user_only);
  fs::remove(out / ".notes.txt.tmp-99999990");
  EXPECT_EQ(prepare_byte_level({a, b}, out.string(), /*append=*/true).listed_files, 2);
  // A temporary name carrying the id of a running process (this one) may still be written:
  // the message says so.
  const fs::path live = out / (".c.npy.tmp-" + std::to_string(::getpid()));
  std::ofstream(live) << "";
  const std::string msg = error_of([&] { prepare_byte_level({write_text("c.txt", "third\n")}, out.string(), true); });
  EXPECT_NE(msg.find(live.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("(" + std::to_string(::getpid()) + ") is running"), std::string::npos) << msg;
  EXPECT_TRUE(fs::exists(live));
}

// dataset.json records each input's path as JSON text, which must be UTF-8: a file name that is
// not is refused before anything is written, naming it (its odd bytes as \xNN).
TEST_F(PrepareTest, an_input_name_that_is_not_utf8_is_refused_naming_it_before_anything_is_written) {
  const std::string latin1 = write_text("caf\xe9.txt", "text\n");
  const std::string fine = write_text("ok.txt", "text\n");
  const fs::path out = dir_ / "out";
  const std::string msg = error_of([&] { prepare_byte_level({fine, latin1}, out.string()); });
  EXPECT_NE(msg.find((dir_ / "caf\\xe9.txt").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("not valid UTF-8"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("json.exception"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out));
  // UTF-8 names are fine.
  const std::string accented = write_text("caf\xc3\xa9.txt", "text\n");
  EXPECT_EQ(prepare_byte_level({accented}, out.string()).files.at(0).name, "caf\xc3\xa9.npy");
}

TEST_F(PrepareTest, prepare_into_a_folder_holding_output_is_refused_and_the_output_stays_byte_identical) {
  const std::string a = write_text("a.txt", "the first corpus\n");
  const fs::path out = dir_ / "out";
  prepare_byte_level({a}, out.string());
  const auto first = snapshot(out);
  ASSERT_EQ(first.size(), 2u);

  // The same input again (it would overwrite a.npy), and a different one (dataset.json would
  // lose a.npy): both refused, naming the folder, what it holds and --append.
  const std::string a_changed = write_text("a.txt", "a different text with the same stem\n");
  const std::string b = write_text("b.txt", "another corpus\n");
  for (const std::vector<std::string>& inputs : {std::vector<std::string>{a_changed}, std::vector<std::string>{b}}) {
    const std::string msg = error_of([&] { prepare_byte_level(inputs, out.string()); });
    EXPECT_NE(msg.find(out.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("a.npy, dataset.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("pass --append"), std::string::npos) << msg;
    EXPECT_EQ(snapshot(out), first);
  }
  // Any entry makes a folder non-empty, not only prepare output; without a dataset.json there the
  // message does not suggest --append (which refuses such a folder too).
  const fs::path other = dir_ / "other";
  fs::create_directories(other / "notes");
  const std::string msg = error_of([&] { prepare_byte_level({b}, other.string()); });
  EXPECT_NE(msg.find("notes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("holds no dataset.json, so --append cannot add to it either"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("pass --append"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(other / "b.npy"));
  // An existing empty folder is fine.
  fs::create_directories(dir_ / "empty");
  EXPECT_EQ(prepare_byte_level({b}, (dir_ / "empty").string()).files.size(), 1u);
}

TEST_F(PrepareTest, append_adds_files_and_dataset_json_lists_the_old_then_the_new_ones) {
  const std::string a = write_text("a.txt", "alpha text\n");
  const std::string b = write_text("b.txt", "beta\f\n");
  const std::string c = write_text("c.md", "gamma\n\f\ndelta\n");
  const fs::path out = dir_ / "out";
  prepare_byte_level({a}, out.string());
  const auto first = snapshot(out);

  const PrepareResult r = prepare_byte_level({c, b}, out.string(), /*append=*/true);
  ASSERT_EQ(r.files.size(), 2u);
  EXPECT_EQ(r.listed_files, 3);
  EXPECT_EQ(snapshot(out).at("a.npy"), first.at("a.npy"));  // the old file is untouched
  EXPECT_EQ(read_tokens((out / "b.npy").string()), bytes_then_eos("beta\f\n"));
  EXPECT_EQ(read_tokens((out / "c.npy").string()).size(), std::string("gamma\ndelta\n").size() + 2);

  const nlohmann::json meta = read_json(out / "dataset.json");
  const nlohmann::json first_meta = nlohmann::json::parse(first.at("dataset.json"));
  EXPECT_EQ(meta["tokenizer"], "byte");
  EXPECT_EQ(meta["vocab_size"], 257);
  ASSERT_EQ(meta["files"].size(), 3u);
  EXPECT_EQ(meta["files"][0], first_meta["files"][0]);  // the old entry, as it was
  EXPECT_EQ(meta["files"][1]["name"], "c.npy");
  EXPECT_EQ(meta["files"][1]["documents"], 2);
  EXPECT_EQ(meta["files"][1]["source"], c);
  EXPECT_EQ(meta["files"][2]["name"], "b.npy");
  EXPECT_EQ(meta["files"][2]["tokens"], 7);

  int entries = 0;  // no temporaries left
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(out)) ++entries;
  EXPECT_EQ(entries, 4);
  DataConfig cfg;
  cfg.path = out.string();
  cfg.eval_fraction = 0.0;
  const TokenDataset ds = TokenDataset::open(cfg, 257, 256);
  ASSERT_EQ(ds.files().size(), 3u);
  EXPECT_EQ(ds.train_tokens(), meta["files"][0]["tokens"].get<int64_t>() + r.total_tokens);
}

TEST_F(PrepareTest, append_with_a_colliding_stem_is_refused_naming_both_and_changes_nothing) {
  const std::string a = write_text("a.txt", "first\n");
  const std::string b = write_text("b.txt", "second\n");
  fs::create_directories(dir_ / "sub");
  const std::string a_again = write_text("sub/a.md", "same stem, other text\n");
  const fs::path out = dir_ / "out";
  prepare_byte_level({a}, out.string());
  const auto before = snapshot(out);

  // a.md becomes a.npy, which dataset.json lists.
  std::string msg = error_of([&] { prepare_byte_level({b, a_again}, out.string(), /*append=*/true); });
  EXPECT_NE(msg.find(a_again), std::string::npos) << msg;
  EXPECT_NE(msg.find((out / "a.npy").string()), std::string::npos) << msg;
  EXPECT_EQ(snapshot(out), before);

  // b.npy is not listed but something of that name is on disk (a folder is not token data, so
  // the folder still matches its dataset.json).
  fs::create_directories(out / "b.npy");
  const auto with_folder = snapshot(out);
  msg = error_of([&] { prepare_byte_level({b}, out.string(), /*append=*/true); });
  EXPECT_NE(msg.find(b), std::string::npos) << msg;
  EXPECT_NE(msg.find((out / "b.npy").string() + ", which already exists"), std::string::npos) << msg;
  EXPECT_EQ(snapshot(out), with_folder);
}

TEST_F(PrepareTest, append_to_a_folder_that_is_not_a_byte_level_prepare_dataset_is_refused_naming_the_key) {
  const std::string b = write_text("b.txt", "new text\n");
  const fs::path out = dir_ / "out";
  fs::create_directories(out);
  write_npy((out / "x.npy").string(), std::vector<uint16_t>(100, 7));
  const auto json_with = [&](const std::string& key, const nlohmann::ordered_json& value) {
    nlohmann::ordered_json meta = {{"tokenizer", "byte"},
                                   {"vocab_size", 257},
                                   {"eos_token_id", 256},
                                   {"dtype", "uint16"},
                                   {"files", {{{"name", "x.npy"}, {"tokens", 100}}}}};
    if (value.is_null())
      meta.erase(key);
    else
      meta[key] = value;
    std::ofstream(out / "dataset.json") << meta.dump();
  };
  const std::pair<std::string, nlohmann::ordered_json> cases[] = {
      {"tokenizer", "huggingface"}, {"vocab_size", 50280}, {"eos_token_id", 0},
      {"dtype", "uint32"},          {"dtype", nullptr},    {"files", "x.npy"},
      {"vocab_size", 257.0},        {"eos_token_id", 256.0},  // equal in value, but no integer: train refuses them
  };
  for (const auto& [key, value] : cases) {
    json_with(key, value);
    const auto before = snapshot(out);
    const std::string msg = error_of([&] { prepare_byte_level({b}, out.string(), /*append=*/true); });
    EXPECT_NE(msg.find((out / "dataset.json").string()), std::string::npos) << key << ": " << msg;
    EXPECT_NE(msg.find("\"" + key + "\""), std::string::npos) << key << ": " << msg;
    EXPECT_EQ(snapshot(out), before) << key;
  }
  // Not JSON at all.
  std::ofstream(out / "dataset.json") << "{\"files\": [";
  std::string msg = error_of([&] { prepare_byte_level({b}, out.string(), /*append=*/true); });
  EXPECT_NE(msg.find("dataset.json is not valid JSON"), std::string::npos) << msg;
  // .npy files without any dataset.json: what they hold is unknown.
  fs::remove(out / "dataset.json");
  msg = error_of([&] { prepare_byte_level({b}, out.string(), /*append=*/true); });
  EXPECT_NE(msg.find("x.npy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no dataset.json"), std::string::npos) << msg;
  // The control: the same folder with a byte-level dataset.json takes the new file.
  json_with("dtype", "uint16");
  EXPECT_EQ(prepare_byte_level({b}, out.string(), /*append=*/true).listed_files, 2);
}

TEST_F(PrepareTest, append_to_a_folder_that_does_not_match_its_dataset_json_is_refused) {
  const std::string a = write_text("a.txt", "first\n");
  const std::string b = write_text("b.txt", "second\n");
  const fs::path out = dir_ / "out";
  prepare_byte_level({a}, out.string());
  write_npy((out / "stray.npy").string(), std::vector<uint16_t>(10, 1));  // e.g. left by an older prepare
  std::string msg = error_of([&] { prepare_byte_level({b}, out.string(), /*append=*/true); });
  EXPECT_NE(msg.find((out / "stray.npy").string()), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out / "b.npy"));
  fs::remove(out / "stray.npy");
  fs::remove(out / "a.npy");
  msg = error_of([&] { prepare_byte_level({b}, out.string(), /*append=*/true); });
  EXPECT_NE(msg.find("lists a.npy"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(out / "b.npy"));
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

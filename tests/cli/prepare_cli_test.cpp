// `moetrain prepare` never overwrites: into a folder that holds anything it is refused unless
// --append, which adds files without touching the old ones; and training reads exactly the files
// a prepared folder's dataset.json lists, refusing a folder where the two disagree. Every case
// runs the real binary on the CPU; the positive controls train on what prepare wrote.
#include <map>

#include "cli_test_util.h"

namespace {

class PrepareCliTest : public CliTest {
 protected:
  // A text of `bytes` bytes: after byte-level prepare, one document of bytes + 1 tokens, enough
  // for the tiny run's windows of seq_len + 1 = 17 tokens.
  std::string write_text(const std::string& name, size_t bytes, char first) {
    std::string text;
    for (size_t i = 0; i < bytes; ++i) text += static_cast<char>(first + static_cast<char>(i % 23));
    write_file(path(name), text);
    return path(name);
  }
  // Every file under `dir` (relative name -> bytes).
  static std::map<std::string, std::string> snapshot(const std::string& dir) {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(dir))
      files[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? read_file(e.path().string()) : "<dir>";
    return files;
  }
  std::vector<std::string> train_on(const std::string& data) const {
    return tiny_train({"--set", "data.path=" + data, "--set", "run.device=cpu"});
  }
  static std::vector<std::string> listed_names(const std::string& dataset_json) {
    const nlohmann::json meta = nlohmann::json::parse(read_file(dataset_json));
    std::vector<std::string> names;
    for (const auto& f : meta["files"]) names.push_back(f["name"]);
    return names;
  }
};

TEST_F(PrepareCliTest, prepare_twice_into_the_same_folder_is_refused_and_the_first_output_is_byte_identical) {
  const std::string a = write_text("a.txt", 2000, 'a');
  ASSERT_EQ(moetrain({"prepare", a, "--out", path("data")}).exit_code, 0);
  const auto first = snapshot(path("data"));
  ASSERT_EQ(first.size(), 2u);

  // Before, this rewrote a.npy in place and dataset.json to list only the second call's files.
  const std::string b = write_text("b.txt", 1500, 'b');
  expect_error(moetrain({"prepare", b, "--out", path("data")}), {path("data"), "a.npy", "--append"});
  write_text("a.txt", 1000, 'k');  // the same stem, another text
  expect_error(moetrain({"prepare", a, b, "--out", path("data")}), {path("data"), "--append"});
  EXPECT_EQ(snapshot(path("data")), first);
}

TEST_F(PrepareCliTest, prepare_append_adds_files_dataset_json_lists_both_and_the_folder_trains) {
  const std::string a = write_text("a.txt", 2000, 'a');
  const std::string b = write_text("b.txt", 1500, 'b');
  ASSERT_EQ(moetrain({"prepare", a, "--out", path("data")}).exit_code, 0);
  const std::string a_npy = read_file(path("data/a.npy"));
  const CliRun r = moetrain({"prepare", b, "--append", "--out", path("data")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("dataset.json, which lists 2 files"), std::string::npos) << r.out;
  EXPECT_EQ(read_file(path("data/a.npy")), a_npy);
  EXPECT_EQ(listed_names(path("data/dataset.json")), (std::vector<std::string>{"a.npy", "b.npy"}));

  const CliRun train = moetrain(train_on(path("data")));
  ASSERT_EQ(train.exit_code, 0) << "stdout:\n" << train.out << "\nstderr:\n" << train.err;
  EXPECT_NE(train.out.find("2 .npy files in " + path("data")), std::string::npos) << train.out;
  EXPECT_NE(train.out.find("3502 tokens"), std::string::npos) << train.out;  // 2001 + 1501: both files read
  EXPECT_EQ(read_metrics(run_dir() + "/metrics.jsonl").size(), 1u);
}

TEST_F(PrepareCliTest, prepare_append_with_a_colliding_stem_is_refused_and_changes_nothing) {
  const std::string a = write_text("a.txt", 2000, 'a');
  const std::string b = write_text("b.txt", 1500, 'b');
  ASSERT_EQ(moetrain({"prepare", a, "--out", path("data")}).exit_code, 0);
  const auto before = snapshot(path("data"));
  fs::create_directory(path("other"));
  const std::string a_other = write_text("other/a.md", 500, 'x');
  expect_error(moetrain({"prepare", b, a_other, "--append", "--out", path("data")}), {a_other, path("data/a.npy")});
  EXPECT_EQ(snapshot(path("data")), before);
}

TEST_F(PrepareCliTest, training_on_a_folder_with_an_npy_that_dataset_json_does_not_list_is_refused_naming_it) {
  ASSERT_EQ(moetrain({"prepare", write_text("a.txt", 2000, 'a'), "--out", path("data")}).exit_code, 0);
  write_file(path("data/extra.npy"), npy_u16(valid_tokens(3000)));
  expect_error(moetrain(train_on(path("data"))), {path("data/extra.npy"), path("data/dataset.json"), "--append"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(PrepareCliTest, training_on_a_folder_missing_a_listed_file_is_refused_naming_it) {
  const std::string a = write_text("a.txt", 2000, 'a');
  const std::string b = write_text("b.txt", 1500, 'b');
  ASSERT_EQ(moetrain({"prepare", a, b, "--out", path("data")}).exit_code, 0);
  fs::remove(path("data/b.npy"));
  expect_error(moetrain(train_on(path("data"))), {path("data/dataset.json"), "b.npy", "does not exist"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

}  // namespace

// `moetrain prepare` never overwrites: into a folder that holds anything it is refused unless
// --append, which adds files without touching the old ones; and training reads exactly the files
// a prepared folder's dataset.json lists, refusing a folder where the two disagree. Every case
// runs the real binary on the CPU; the positive controls train on what prepare wrote.
#include <map>

#include "cli_test_util.h"

namespace {

class PrepareCliTest : public CliTest {
 protected:
  // Shell text that waits until folder `out` holds a temporary file of a prepare: at most a minute,
  // the test hook's own limit (10 s before; one unexplained failure of a test using it on a loaded
  // 2-core machine may have been that wait running out).
  static std::string until_a_temporary_is_in(const std::string& out) {
    return "for i in $(seq 3000); do ls -A '" + out + "' 2>/dev/null | grep -q '[.]tmp-' && break; sleep 0.02; done";
  }
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

// Ctrl-C, SIGTERM or SIGHUP in the middle of a prepare: its temporary files (and the output
// folder it created) are removed, it says so, and it dies of the signal (status 128 + signal, so
// a calling script stops as for any interrupted command). A test hook makes it wait for the
// signal once its first temporary file is written.
TEST_F(PrepareCliTest, an_interrupted_prepare_removes_its_temporary_files_and_dies_of_the_signal) {
  const std::string a = write_text("a.txt", 2000, 'a');
  const std::string b = write_text("b.txt", 1500, 'b');
  // The job runs under job control (set -m): a background job of a plain script ignores SIGINT.
  const auto interrupted = [&](const std::vector<std::string>& args, const std::string& out, const char* signal) {
    std::string cmd = "set -m; MOE_TEST_PREPARE_PAUSE=1 '" MOE_BINARY_DIR "/moetrain'";
    for (const std::string& arg : args) cmd += " '" + arg + "'";
    cmd += " & pid=$!; " + until_a_temporary_is_in(out) + "; kill -" + signal + " $pid; wait $pid";
    return run({"/bin/bash", "-c", cmd});
  };
  const struct {
    const char* name;
    int number;
  } signals[] = {{"INT", 2}, {"TERM", 15}, {"HUP", 1}};
  for (const auto& sig : signals) {
    const std::string out = path(std::string("new-") + sig.name + "/data");
    const CliRun r = interrupted({"prepare", a, b, "--out", out}, out, sig.name);
    EXPECT_EQ(r.exit_code, 128 + sig.number) << sig.name << "\n" << r.err;
    EXPECT_NE(r.err.find(std::string("error: prepare was interrupted (SIG") + sig.name + ")"), std::string::npos)
        << r.err;
    EXPECT_FALSE(fs::exists(path(std::string("new-") + sig.name))) << "the folders it created are removed";
  }
  // Into an existing dataset (--append): the dataset is left as it was.
  ASSERT_EQ(moetrain({"prepare", a, "--out", path("data")}).exit_code, 0);
  const auto before = snapshot(path("data"));
  const CliRun r = interrupted({"prepare", b, "--append", "--out", path("data")}, path("data"), "TERM");
  EXPECT_EQ(r.exit_code, 128 + 15) << r.err;
  EXPECT_EQ(snapshot(path("data")), before);
  // A signal ignored when prepare starts (nohup) stays ignored.
  const std::string cmd = "trap '' HUP; MOE_TEST_PREPARE_PAUSE=1 '" MOE_BINARY_DIR "/moetrain' prepare '" + b +
                          "' --out '" + path("nohup") + "' & pid=$!; " + until_a_temporary_is_in(path("nohup")) +
                          "; kill -HUP $pid; sleep 0.3; kill -0 $pid || exit 3; kill -TERM $pid; wait $pid";
  EXPECT_EQ(run({"/bin/bash", "-c", cmd}).exit_code, 128 + 15);
  EXPECT_FALSE(fs::exists(path("nohup")));
}

// A prepare killed outright leaves its temporary files: the next prepare names them, says they
// are safe to delete, and refuses, with --append as without (before, it suggested --append, which
// then succeeded and left them for good).
TEST_F(PrepareCliTest, temporary_files_of_a_killed_prepare_are_named_and_refused_even_with_append) {
  const std::string a = write_text("a.txt", 2000, 'a');
  const std::string cmd = "MOE_TEST_PREPARE_PAUSE=1 '" MOE_BINARY_DIR "/moetrain' prepare '" + a + "' --out '" +
                          path("data") + "' & pid=$!; " + until_a_temporary_is_in(path("data")) +
                          "; kill -KILL $pid; wait $pid";
  ASSERT_EQ(run({"/bin/bash", "-c", cmd}).exit_code, 128 + 9);
  std::vector<std::string> leftovers;
  for (const auto& e : fs::directory_iterator(path("data"))) leftovers.push_back(e.path().string());
  ASSERT_EQ(leftovers.size(), 1u);
  EXPECT_NE(leftovers[0].find("/.a.npy.tmp-"), std::string::npos) << leftovers[0];
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"prepare", a, "--out", path("data")},
        std::vector<std::string>{"prepare", a, "--append", "--out", path("data")}}) {
    const CliRun r = moetrain(args);
    expect_error(r, {leftovers[0], "left by an interrupted prepare", "safe to delete"});
    EXPECT_EQ(r.err.find("pass --append"), std::string::npos) << r.err;
    EXPECT_TRUE(fs::exists(leftovers[0])) << "another process's temporary file is never deleted";
    EXPECT_FALSE(fs::exists(path("data/a.npy")));
  }
  fs::remove(leftovers[0]);
  EXPECT_EQ(moetrain({"prepare", a, "--out", path("data")}).exit_code, 0);
}

// dataset.json records each input's path, and JSON text is UTF-8: a name that is not is refused
// up front, naming the file (not "[json.exception.type_error.316] invalid UTF-8 byte").
TEST_F(PrepareCliTest, an_input_name_that_is_not_utf8_is_refused_naming_it) {
  write_text("caf\xe9.txt", 2000, 'a');
  const CliRun r = moetrain({"prepare", path("caf\xe9.txt"), "--out", path("data")});
  expect_error(r, {path("caf\\xe9.txt"), "not valid UTF-8"});
  EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("data")));
}

// A file that appears in the output folder under a name prepare is about to take (after its
// checks, before its renames) is never overwritten, and the files the call already renamed are
// removed again: the folder holds the other file and nothing of the failed call. Before, a failure
// halfway through the renames left part of a dataset. The test hook holds prepare after writing its
// temporary files until the file named by MOE_TEST_PREPARE_PAUSE exists.
TEST_F(PrepareCliTest, a_file_appearing_under_a_target_name_stops_prepare_and_leaves_no_part_of_a_dataset) {
  const std::string a = write_text("a.txt", 2000, 'a');
  const std::string b = write_text("b.txt", 1500, 'b');
  const std::string resume = path("resume");
  const std::string cmd = "MOE_TEST_PREPARE_PAUSE='" + resume + "' '" MOE_BINARY_DIR "/moetrain' prepare '" + a +
                          "' '" + b + "' --out '" + path("data") + "' & pid=$!; " +
                          until_a_temporary_is_in(path("data")) + "; echo mine > '" + path("data/b.npy") +
                          "'; touch '" + resume + "'; wait $pid";
  const CliRun r = run({"/bin/bash", "-c", cmd});
  expect_error(r, {path("data/b.npy"), "appeared while prepare ran"});
  const std::map<std::string, std::string> expected = {{"b.npy", "mine\n"}};
  EXPECT_EQ(snapshot(path("data")), expected) << "a.npy renamed before the failure is removed; b.npy is untouched";
}

// On a file system that cannot lock a folder opened read-only (NFS: EBADF; a test hook fakes it),
// prepare goes on unlocked and says once what that risks. Before, every prepare there failed with
// "cannot lock".
TEST_F(PrepareCliTest, prepare_on_a_file_system_without_folder_locks_goes_on_and_says_so) {
  const std::string a = write_text("a.txt", 2000, 'a');
  const CliRun r = run({"/bin/bash", "-c", "MOE_TEST_NO_FOLDER_LOCKS=1 '" MOE_BINARY_DIR "/moetrain' prepare '" + a +
                                               "' --out '" + path("new/data") + "'"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("cannot lock folders (NFS"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("cannot lock folders", r.err.find("cannot lock folders") + 1), std::string::npos)
      << "said once:\n" << r.err;
  EXPECT_EQ(listed_names(path("new/data/dataset.json")), std::vector<std::string>{"a.npy"});
}

// An --out with a trailing slash (tab completion) names the folder: it is created, and named
// without the slash. Before, the slash made a second, failing creation of the same folder
// ("cannot create output folder .../new/data/: Success").
TEST_F(PrepareCliTest, an_output_folder_given_with_a_trailing_slash_is_created) {
  const std::string a = write_text("a.txt", 2000, 'a');
  const CliRun r = moetrain({"prepare", a, "--out", path("new/data/")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(path("new/data") + "/dataset.json, which lists 1 file"), std::string::npos) << r.out;
  EXPECT_EQ(listed_names(path("new/data/dataset.json")), std::vector<std::string>{"a.npy"});
}

// An --out that is a link to nothing said "cannot create output folder ...: File exists".
TEST_F(PrepareCliTest, an_output_that_is_a_link_to_nothing_is_named_as_such_and_left_alone) {
  const std::string a = write_text("a.txt", 2000, 'a');
  fs::create_symlink(path("gone"), path("link"));
  const CliRun r = moetrain({"prepare", a, "--out", path("link")});
  expect_error(r, {path("link"), "is a symbolic link to nothing (to a missing " + path("gone") + ")"});
  EXPECT_TRUE(fs::is_symlink(path("link")));
  EXPECT_FALSE(fs::exists(path("gone")));
}

// A prepare into a folder that another prepare is creating waits for it (saying so), then sees
// what it wrote. Before, it locked the new folder while the first held only the folder's parent,
// and took the first call's temporary files for an interrupted prepare's.
TEST_F(PrepareCliTest, a_prepare_into_a_folder_another_is_creating_waits_for_it_and_then_appends) {
  const std::string a = write_text("a.txt", 2000, 'a');
  const std::string b = write_text("b.txt", 1500, 'b');
  const std::string out = path("new/data");
  const std::string resume = path("resume");
  const std::string second_err = path("second.err");
  // The first is resumed once the second has said it waits (30 s at most), not after a fixed time:
  // a loaded machine may take longer than any fixed time to start the second.
  const std::string cmd = "MOE_TEST_PREPARE_PAUSE='" + resume + "' '" MOE_BINARY_DIR "/moetrain' prepare '" + a +
                          "' --out '" + out + "' > /dev/null & first=$!; " + until_a_temporary_is_in(out) +
                          "; '" MOE_BINARY_DIR "/moetrain' prepare '" + b + "' --append --out '" + out +
                          "' > /dev/null 2> '" + second_err + "' & second=$!; for i in $(seq 1500); do grep -q "
                          "'waiting for another prepare' '" + second_err + "' && break; kill -0 $second || exit 3; "
                          "sleep 0.02; done; touch '" + resume + "'; wait $first || exit 4; wait $second; rc=$?; cat '" +
                          second_err + "' >&2; exit $rc";
  const CliRun r = run({"/bin/bash", "-c", cmd});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("prepare: waiting for another prepare or tokenize_hf.py writing into " + out + " to finish"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(listed_names(out + "/dataset.json"), (std::vector<std::string>{"a.npy", "b.npy"}));
  EXPECT_EQ(moetrain(train_on(out)).exit_code, 0) << "the folder trains";
}

}  // namespace

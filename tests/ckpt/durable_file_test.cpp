// write_new_file_atomic (ckpt/durable_file.h), the last step of every output that must be new
// (bench --json, plan --json, bench --calibrate): whatever has the name by then is never replaced.
// rewrite_file_atomic and move_entries, which the run's records and set-asides use on files that
// may be a user's links.
#include "moe/ckpt/durable_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "moe/core/error.h"
#include "temp_dir.h"

namespace moe {
namespace {

using moe::testing::read_bytes;
using moe::testing::TempDir;
using moe::testing::write_bytes;
namespace fs = std::filesystem;

std::string error_of_writing(const std::string& path) {
  try {
    write_new_file_atomic(path, "{\"new\": true}\n", "bench --json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// No file but `keep` in the folder: the temporary one is gone too.
void expect_only(const TempDir& tmp, const std::string& keep) {
  for (const auto& e : fs::directory_iterator(tmp.path))
    EXPECT_EQ(e.path().filename().string(), keep) << "left behind: " << e.path();
}

TEST(WriteNewFileAtomic, writes_a_new_file) {
  TempDir tmp;
  EXPECT_EQ(error_of_writing(tmp / "report.json"), "");
  EXPECT_EQ(read_bytes(tmp / "report.json"), "{\"new\": true}\n");
  expect_only(tmp, "report.json");
}

// A file that appeared after the command checked its output (a bench runs for minutes) was
// replaced by the final rename.
TEST(WriteNewFileAtomic, a_file_that_appeared_meanwhile_is_named_and_kept) {
  TempDir tmp;
  write_bytes(tmp / "report.json", "mine");
  const std::string msg = error_of_writing(tmp / "report.json");
  EXPECT_NE(msg.find("bench --json " + (tmp / "report.json") + " exists"), std::string::npos) << msg;
  EXPECT_EQ(read_bytes(tmp / "report.json"), "mine");
  expect_only(tmp, "report.json");
}

// A symbolic link to nothing passed the exists() check, and the rename replaced the link itself.
TEST(WriteNewFileAtomic, a_symbolic_link_even_to_nothing_is_named_and_kept) {
  TempDir tmp;
  fs::create_symlink(tmp / "elsewhere.json", tmp / "report.json");
  const std::string msg = error_of_writing(tmp / "report.json");
  EXPECT_NE(msg.find("exists"), std::string::npos) << msg;
  EXPECT_TRUE(fs::is_symlink(tmp / "report.json"));
  EXPECT_FALSE(fs::exists(tmp / "elsewhere.json"));
  expect_only(tmp, "report.json");
}

TEST(RewriteFileAtomic, through_a_link_the_file_it_names_is_rewritten_and_the_link_stays) {
  TempDir tmp;
  fs::create_directories(tmp / "run");
  write_bytes(tmp / "elsewhere.jsonl", "old\n");
  fs::create_symlink("../elsewhere.jsonl", tmp / "run/metrics.jsonl");
  rewrite_file_atomic(tmp / "run/metrics.jsonl", "kept\n");
  EXPECT_TRUE(fs::is_symlink(tmp / "run/metrics.jsonl"));
  EXPECT_EQ(read_bytes(tmp / "elsewhere.jsonl"), "kept\n");
  rewrite_file_atomic(tmp / "plain.jsonl", "new\n");  // a plain file: write_file_atomic's
  EXPECT_EQ(read_bytes(tmp / "plain.jsonl"), "new\n");
}

TEST(MoveEntries, a_relative_link_moved_into_another_folder_still_names_its_target) {
  TempDir tmp;
  fs::create_directories(tmp / "run/replaced/t");
  write_bytes(tmp / "elsewhere.jsonl", "records\n");
  fs::create_symlink("../elsewhere.jsonl", tmp / "run/metrics.jsonl");
  move_entries(tmp / "run", {"metrics.jsonl"}, tmp / "run/replaced/t");
  EXPECT_FALSE(fs::exists(fs::symlink_status(tmp / "run/metrics.jsonl")));
  ASSERT_TRUE(fs::is_symlink(tmp / "run/replaced/t/metrics.jsonl"));
  EXPECT_EQ(read_bytes(tmp / "run/replaced/t/metrics.jsonl"), "records\n");
  EXPECT_EQ(read_bytes(tmp / "elsewhere.jsonl"), "records\n") << "what the link names does not move";

  // What the link names is never looked at: one to a place that cannot be resolved moves as well.
  fs::create_symlink("../missing/x", tmp / "run/gone");
  move_entries(tmp / "run", {"gone"}, tmp / "run/replaced/t");
  EXPECT_EQ(fs::read_symlink(tmp / "run/replaced/t/gone"), fs::canonical(tmp.path) / "missing/x");
}

TEST(MoveEntries, links_inside_a_moved_folder_keep_naming_what_they_named) {
  TempDir tmp;
  fs::create_directories(tmp / "run/tensorboard/sub");
  fs::create_directories(tmp / "run/replaced");
  write_bytes(tmp / "disk.events", "outside");
  write_bytes(tmp / "run/tensorboard/own.events", "inside");
  fs::create_symlink("../../disk.events", tmp / "run/tensorboard/a.events");  // names something outside
  fs::create_symlink("../own.events", tmp / "run/tensorboard/sub/b.events");  // names something inside
  move_entries(tmp / "run", {"tensorboard"}, tmp / "run/replaced");
  EXPECT_EQ(read_bytes(tmp / "run/replaced/tensorboard/a.events"), "outside");
  EXPECT_EQ(read_bytes(tmp / "run/replaced/tensorboard/sub/b.events"), "inside");
  EXPECT_TRUE(fs::read_symlink(tmp / "run/replaced/tensorboard/a.events").is_absolute());
  EXPECT_EQ(fs::read_symlink(tmp / "run/replaced/tensorboard/sub/b.events"), "../own.events")
      << "a link inside the folder to something inside it stays as it was";
}

TEST(MoveEntries, a_link_to_another_entry_moved_with_it_stays_relative_and_working) {
  TempDir tmp;
  fs::create_directories(tmp / "run/tensorboard");
  fs::create_directories(tmp / "run/replaced");
  write_bytes(tmp / "run/tensorboard/metrics.jsonl", "records\n");
  fs::create_symlink("tensorboard/metrics.jsonl", tmp / "run/metrics.jsonl");
  move_entries(tmp / "run", {"metrics.jsonl", "tensorboard"}, tmp / "run/replaced");
  EXPECT_EQ(fs::read_symlink(tmp / "run/replaced/metrics.jsonl"), "tensorboard/metrics.jsonl");
  EXPECT_EQ(read_bytes(tmp / "run/replaced/metrics.jsonl"), "records\n");
}

TEST(MoveEntries, plain_files_are_renamed_and_a_name_that_exists_is_refused_before_anything_moves) {
  TempDir tmp;
  write_bytes(tmp / "a", "a");
  write_bytes(tmp / "b", "b");
  fs::create_directories(tmp / "to");
  fs::create_symlink("nowhere", tmp / "to/b");  // a dangling link is a name that exists
  try {
    move_entries(tmp.path, {"a", "b"}, tmp / "to");
    ADD_FAILURE() << "moved over an existing name";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("that name exists (nothing was moved)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_bytes(tmp / "a"), "a");
  EXPECT_EQ(read_bytes(tmp / "b"), "b");
  fs::remove(tmp / "to/b");
  move_entries(tmp.path, {"a", "b"}, tmp / "to");
  EXPECT_EQ(read_bytes(tmp / "to/a"), "a");
  EXPECT_EQ(read_bytes(tmp / "to/b"), "b");
  EXPECT_FALSE(fs::exists(tmp / "a"));
}

}  // namespace
}  // namespace moe

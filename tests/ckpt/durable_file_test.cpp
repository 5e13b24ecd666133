// write_new_file_atomic (ckpt/durable_file.h), the last step of every output that must be new
// (bench --json, plan --json, bench --calibrate): whatever has the name by then is never replaced.
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

}  // namespace
}  // namespace moe

// .npy token files: round trips, and every malformed file gives an error naming the file.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "moe/core/error.h"
#include "moe/data/npy.h"
#include "moe/data/token_array.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moe_npy_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a .npy by hand: magic, version, header dict (padded), then `payload` bytes.
  std::string write_raw(const std::string& name, const std::string& dict, size_t payload_bytes, int major = 1,
                        const std::string& magic = "\x93NUMPY") {
    std::string header = dict;
    const size_t prefix = major == 1 ? 10 : 12;
    while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string bytes = magic;
    bytes += static_cast<char>(major);
    bytes += '\0';
    const size_t len = header.size();
    bytes += static_cast<char>(len & 0xff);
    bytes += static_cast<char>((len >> 8) & 0xff);
    if (major != 1) bytes += std::string(2, '\0');
    bytes += header;
    bytes += std::string(payload_bytes, '\0');
    std::ofstream(file(name), std::ios::binary) << bytes;
    return file(name);
  }

  // Expects reading `path` to fail with a message that names the file and contains `what`.
  void expect_error(const std::string& path, const std::string& what) {
    try {
      TokenArray::open_npy(path);
      FAIL() << "expected an error for " << path;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  }

  fs::path dir_;
};

}  // namespace

TEST_F(NpyTest, uint16_round_trip) {
  std::vector<uint16_t> values = {0, 1, 2, 255, 256, 65535, 12345};
  write_npy(file("a.npy"), values);
  const TokenArray t = TokenArray::open_npy(file("a.npy"));
  EXPECT_EQ(t.dtype(), TokenDType::U16);
  ASSERT_EQ(t.size(), 7);
  for (int64_t i = 0; i < t.size(); ++i) EXPECT_EQ(t.at(i), values[i]);
  EXPECT_EQ(read_npy_header(file("a.npy")).data_offset % 64, 0);
}

TEST_F(NpyTest, uint32_round_trip_and_move) {
  std::vector<uint32_t> values(100001);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint32_t>(i * 2654435761u);
  values.back() = 0xffffffffu;
  write_npy(file("b.npy"), values);
  TokenArray opened = TokenArray::open_npy(file("b.npy"));
  const TokenArray t = std::move(opened);
  EXPECT_EQ(t.dtype(), TokenDType::U32);
  ASSERT_EQ(t.size(), static_cast<int64_t>(values.size()));
  for (int64_t i = 0; i < t.size(); ++i) ASSERT_EQ(t.at(i), values[i]) << i;
}

// eval --logits: whatever has the name when the logits are written (a file that appeared while
// the evaluation ran, a symbolic link even to nothing) was replaced; it is named and kept.
TEST_F(NpyTest, float32_logits_never_replace_what_has_their_name) {
  const std::vector<float> logits = {1.5f, -2.0f};
  write_npy_f32(file("new.npy"), logits, {1, 2});
  EXPECT_EQ(fs::file_size(file("new.npy")), 128u + 8u);  // a 64-byte-aligned header, then two floats
  std::ofstream(file("mine.npy")) << "mine";
  fs::create_symlink(file("nowhere.npy"), file("link.npy"));
  for (const char* name : {"mine.npy", "link.npy"}) {
    try {
      write_npy_f32(file(name), logits, {1, 2});
      ADD_FAILURE() << name << " was replaced";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(file(name) + " exists"), std::string::npos) << e.what();
    }
  }
  std::ifstream in(file("mine.npy"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "mine");
  EXPECT_TRUE(fs::is_symlink(file("link.npy")));
  EXPECT_FALSE(fs::exists(file("nowhere.npy")));
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 3u) << "a temporary file was left behind";
}

// A file small enough to stay in stdio's buffer fails only when fclose flushes it. The reason given
// was then errno as an earlier call had left it (here ENOENT, as a failed stat leaves it), not the
// full disk's; RLIMIT_FSIZE (SIGXFSZ ignored) stands in for the full disk. Nothing is left behind.
TEST_F(NpyTest, a_write_that_fails_at_the_final_flush_gives_its_own_reason) {
  const std::vector<uint16_t> tokens(20, 7);
  const std::vector<float> logits(20, 0.5f);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 100;  // below the 128-byte header
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string token_msg, logits_msg;
  try {
    errno = ENOENT;
    write_new_npy(file("tokens.npy"), tokens);
  } catch (const Error& e) {
    token_msg = e.what();
  }
  try {
    errno = ENOENT;
    write_npy_f32(file("logits.npy"), logits, {4, 5});
  } catch (const Error& e) {
    logits_msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  for (const std::string& msg : {token_msg, logits_msg}) {
    EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("No such file"), std::string::npos) << msg;
  }
  EXPECT_NE(token_msg.find(file("tokens.npy")), std::string::npos) << token_msg;
  EXPECT_NE(logits_msg.find(file("logits.npy")), std::string::npos) << logits_msg;
  EXPECT_TRUE(fs::is_empty(dir_)) << "a partial file was left behind";
}

TEST_F(NpyTest, empty_array_round_trip) {
  write_npy(file("e.npy"), std::vector<uint16_t>{});
  EXPECT_EQ(TokenArray::open_npy(file("e.npy")).size(), 0);
}

TEST_F(NpyTest, reads_version_2_headers_and_numpy_spacing) {
  const std::string p = write_raw("v2.npy", "{'descr': '<u4', 'fortran_order': False, 'shape': (3,), }", 12, 2);
  const TokenArray t = TokenArray::open_npy(p);
  EXPECT_EQ(t.size(), 3);
  EXPECT_EQ(t.dtype(), TokenDType::U32);
  const std::string q = write_raw("sp.npy", "{\"shape\":(5,),\"fortran_order\":False,\"descr\":\"<u2\"}", 10);
  EXPECT_EQ(TokenArray::open_npy(q).size(), 5);
}

TEST_F(NpyTest, truncated_file_names_expected_and_actual_size) {
  write_npy(file("t.npy"), std::vector<uint16_t>(1000, 7));
  const auto full = fs::file_size(file("t.npy"));
  fs::resize_file(file("t.npy"), full - 10);
  expect_error(file("t.npy"), "truncated: expected " + std::to_string(full));
}

TEST_F(NpyTest, trailing_bytes_are_an_error) {
  const std::string p = write_raw("x.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), }", 9);
  expect_error(p, "trailing");
}

TEST_F(NpyTest, bad_magic) {
  const std::string p = write_raw("m.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), }", 8, 1, "NOTNPY");
  expect_error(p, "bad magic");
  std::ofstream(file("tiny.npy")) << "abc";
  expect_error(file("tiny.npy"), "bad magic");
}

TEST_F(NpyTest, wrong_dtype) {
  expect_error(write_raw("i8.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", 32), "'<i8'");
  expect_error(write_raw("u1.npy", "{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }", 4), "'|u1'");
  expect_error(write_raw("be.npy", "{'descr': '>u2', 'fortran_order': False, 'shape': (4,), }", 8), "'>u2'");
}

// The error quotes the header: a NUL byte in it must not end the message (printed as a C string)
// before the reason, nor another control byte break the one line.
TEST_F(NpyTest, header_bytes_quoted_in_errors_are_escaped) {
  const std::string nul_dtype = write_raw("nul.npy", std::string("{'descr': '<u\0\x32', 'fortran_order': False, "
                                                                 "'shape': (4,), }", 58), 8);
  expect_error(nul_dtype, "dtype '<u\\x002' is not supported");
  expect_error(write_raw("key.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), 'x\ny': 1}", 8),
               "unexpected key 'x\\ny'");
  const std::string msg = [&] {
    try {
      TokenArray::open_npy(write_raw("brace.npy", std::string("\x01\0{'descr'", 10), 0));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  EXPECT_NE(msg.find("expected '{' at offset 0 of \"\\x01\\x00{'descr'"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST_F(NpyTest, two_dimensional_or_scalar_or_fortran_is_an_error) {
  expect_error(write_raw("2d.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (3, 4), }", 24),
               "must be 1-D, got shape (3, 4)");
  expect_error(write_raw("0d.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (), }", 2), "must be 1-D");
  expect_error(write_raw("f.npy", "{'descr': '<u2', 'fortran_order': True, 'shape': (4,), }", 8), "fortran_order");
}

TEST_F(NpyTest, missing_file_and_bad_version) {
  expect_error(file("nope.npy"), "cannot open");
  const std::string p = write_raw("v9.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), }", 8, 9);
  expect_error(p, "version 9.0");
}
